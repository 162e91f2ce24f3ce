"""The mailbox: tagged binary messages between a plan's authenticated peers (``box.py``), and its side of
a peer dying, the check whether a peer whose stream ended is still there (``liveness.py``)."""

from potluck.net.mailbox.box import MESSAGE_COST, Mailbox, Service

__all__ = ["MESSAGE_COST", "Mailbox", "Service"]
