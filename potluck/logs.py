"""Logging for a potluck process: one level, the peer and swarm ids on every record, text or JSON lines.

The library only logs; an entry point (the CLI) calls ``configure()`` once. The level is ``-v`` (INFO)
or ``-vv`` (DEBUG) when given, else ``POTLUCK_LOGLEVEL`` (DEBUG, INFO, WARNING, ERROR or CRITICAL),
else WARNING. ``POTLUCK_LOGFORMAT=json`` writes one JSON object a line instead of text. hivemind's records
go through the same handler at the same level (``adopt``), so they carry the ids too.

``bind()`` names the peer and swarm of the current asyncio context: records logged there and in the
tasks and threads it starts afterwards carry them, so several peers in one process stay apart.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextvars import ContextVar
from typing import IO

LEVEL_ENV = "POTLUCK_LOGLEVEL"
FORMAT_ENV = "POTLUCK_LOGFORMAT"
DEFAULT_LEVEL = logging.WARNING  # a volunteer's terminal shows progress, not chatter
LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(ids)s: %(message)s"
LIBRARIES = ("hivemind",)  # loggers that install their own handler; adopt() routes them through ours

_peer_id: ContextVar[str | None] = ContextVar("potluck_peer_id", default=None)
_swarm_id: ContextVar[str | None] = ContextVar("potluck_swarm_id", default=None)
_handler: logging.Handler | None = None  # the handler configure() installed on the root logger


def bind(*, peer_id: str | None = None, swarm_id: str | None = None) -> None:
    """Put these ids on every record logged from the current context from now on."""
    if peer_id is not None:
        _peer_id.set(peer_id)
    if swarm_id is not None:
        _swarm_id.set(swarm_id)


class IdsFilter(logging.Filter):
    """Adds ``peer_id`` and ``swarm_id`` (None when unbound) and ``ids``, their short text form."""

    def filter(self, record: logging.LogRecord) -> bool:
        peer = getattr(record, "peer_id", None) or _peer_id.get()
        swarm = getattr(record, "swarm_id", None) or _swarm_id.get()
        record.peer_id, record.swarm_id = peer, swarm
        # the last 8 characters of a peer id tell peers apart, as `potluck status` shows them
        record.ids = f" [{swarm or '-'} …{peer[-8:]}]" if peer else f" [{swarm}]" if swarm else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (Unix seconds), level, logger, msg, peer_id, swarm_id, exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "peer_id": getattr(record, "peer_id", None),
            "swarm_id": getattr(record, "swarm_id", None),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time, so test runners and rich's live display,
    which swap it, still get the records."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never raise into the caller
            self.handleError(record)


def level_from(verbose: int = 0) -> int:
    """-v INFO, -vv DEBUG; without flags ``POTLUCK_LOGLEVEL``, else WARNING."""
    if verbose >= 2:
        return logging.DEBUG
    if verbose == 1:
        return logging.INFO
    return LEVELS.get(os.environ.get(LEVEL_ENV, "").strip().upper(), DEFAULT_LEVEL)


def configure(verbose: int = 0, *, stream: IO[str] | None = None) -> logging.Handler:
    """Install potluck's handler on the root logger (replacing the one an earlier call installed) and
    return it. ``stream``: write there instead of the current ``sys.stderr``."""
    global _handler
    level = level_from(verbose)
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.addFilter(IdsFilter())
    as_json = os.environ.get(FORMAT_ENV, "text").strip().lower() == "json"
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(level)
    _handler = handler
    # hivemind sets its logger's level from this variable when it is first imported (later, lazily).
    os.environ["HIVEMIND_LOGLEVEL"] = logging.getLevelName(level)
    for name in LIBRARIES:
        adopt(name)
    raw = os.environ.get(LEVEL_ENV, "").strip()
    if raw and raw.upper() not in LEVELS:
        default = logging.getLevelName(DEFAULT_LEVEL)
        logging.getLogger(__name__).warning("%s=%r is not a level; using %s", LEVEL_ENV, raw, default)
    return handler


def adopt(name: str) -> None:
    """Route the library logger ``name`` through potluck's handler at potluck's level, dropping the
    handler the library installed itself. Does nothing until ``configure()`` ran (then the library
    keeps its own)."""
    if _handler is None:
        return
    lib = logging.getLogger(name)
    for handler in list(lib.handlers):
        lib.removeHandler(handler)
    lib.propagate = True
    lib.setLevel(logging.getLogger().level)
