"""The shared language of peers and coordinator: identities, signed records, DHT keys, invites.

Imports nothing from ``potluck.peer`` or ``potluck.coordinator``.
"""
