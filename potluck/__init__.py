"""potluck: decentralized volunteer training over a hivemind DHT.

Packages: ``protocol`` (records, identity, wire: the shared language), ``compression`` (tensor codecs),
``peer`` (the volunteer daemon) and ``coordinator`` (planner and service). ``peer`` and ``coordinator``
meet only through ``protocol``.
"""

__version__ = "0.1.0"
