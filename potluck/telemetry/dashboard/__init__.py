"""The web dashboard: a page and a JSON API over the ``SwarmView`` (``server.py``), assets in ``static/``."""
