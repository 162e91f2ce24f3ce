"""Where a stage's state comes from: this peer's own disk, or live holders over the swarm.

``StateSource.fetch(want, timeout_s)`` answers the tensors of layers [first, last) after ``step`` steps
(weights, AdamW moments and step counts), named as ``StageRunner.state_tensors`` names them for a stage
starting at ``first``, or raises ``StateError`` saying why. ``fetch_first`` tries sources in order and
reports every failure when none works: a mismatch is a failed transfer, and the next source is tried.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from potluck.model.checkpoint import CheckpointError
from potluck.model.resume import load_layers
from potluck.net.streams import Streams
from potluck.protocol.checkpoints import StageMeta
from potluck.transfer.copy import settled
from potluck.transfer.errors import StateError
from potluck.transfer.manifest import StateWant
from potluck.transfer.pull import pull_state
from potluck.transfer.server import TransferConfig, state_protocol
from potluck.transfer.snapshot import StageState, check_covers, rename, select

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchedState:
    tensors: dict[str, torch.Tensor]  # local names for a stage starting at the wanted ``first``
    step: int  # steps the state has taken; global step s reads sequences [s B, (s + 1) B), so it is
    source: str  # also the data position. Which source answered, for logs and reports
    # the fetch made every tensor itself (pulled, read from disk): the stage may take them as its own
    # storage; False where some are this peer's held state (served to others: copied, never taken)
    owned: bool = False


class StateSource(ABC):
    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    async def fetch(self, want: StateWant, timeout_s: float) -> FetchedState:
        """The state ``want`` names within ``timeout_s`` seconds, or ``StateError``."""


class DiskSource(StateSource):
    """This peer's own checkpoint directory (``model/checkpoint``), re-cut to the wanted layers."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def name(self) -> str:
        return f"disk:{self.root}"

    def _load(self, want: StateWant) -> dict[str, torch.Tensor]:
        def check(meta: StageMeta) -> None:
            if (meta.job, meta.model, meta.seed) != (want.job, want.model, want.seed):
                raise CheckpointError(f"{self.root}: step {want.step} is not job {want.job!r} of this model")

        return load_layers(self.root, want.step, want.first, want.last, want.model.n_layers, check)

    async def fetch(self, want: StateWant, timeout_s: float) -> FetchedState:
        try:  # the read thread cannot be interrupted; on timeout it finishes unobserved
            tensors = await asyncio.wait_for(asyncio.to_thread(self._load, want), timeout_s)
        except TimeoutError:
            raise StateError(f"{self.name}: no state within {timeout_s:.0f} s") from None
        except (CheckpointError, OSError) as e:
            raise StateError(f"{self.name}: {e}") from None
        return FetchedState(tensors, want.step, self.name, owned=True)


class LocalSource(StateSource):
    """State this peer still holds from its previous plan epoch: a survivor keeps its layers."""

    def __init__(self, held: StageState | None) -> None:
        self.held = held

    @property
    def name(self) -> str:
        return "local"

    async def fetch(self, want: StateWant, timeout_s: float) -> FetchedState:
        if self.held is None:
            raise StateError("local: this peer holds no state")
        meta = self.held.meta
        same = (meta.job, meta.model, meta.seed, meta.step) == (want.job, want.model, want.seed, want.step)
        if not same or not meta.first_layer <= want.first < want.last <= meta.last_layer:
            raise StateError(
                f"local: this peer holds {meta.job!r} step {meta.step} layers [{meta.first_layer}, "
                f"{meta.last_layer}), not step {want.step} layers [{want.first}, {want.last})"
            )
        n = want.model.n_layers
        tensors = select(rename(self.held.tensors, meta.first_layer), want.first, want.last, n)
        check_covers(tensors, want.first, want.last, n, self.name)
        return FetchedState(rename(tensors, -want.first), want.step, self.name)


@dataclass(frozen=True)
class Holder:
    """A live peer holding layers [first, last) of the job at the wanted step."""

    peer_id: str
    first: int
    last: int


LOCAL_HOLDER = "(this peer)"  # stands for a local copy among the holders of a segment (+ "#index")


class PeerSource(StateSource):
    """Live holders over the swarm: each range of the wanted layers is pulled from every holder that
    covers it at once (``pull.py``), ranges one after the other."""

    def __init__(
        self,
        streams: Streams,
        swarm_id: str,
        holders: Sequence[Holder],
        cfg: TransferConfig,
        local: Sequence[StageState] = (),
    ) -> None:
        self.streams, self.holders, self.cfg = streams, list(holders), cfg
        self._unreachable: frozenset[str] = frozenset()  # holders that refused a stream: dead
        self.protocol = state_protocol(swarm_id)
        # This peer's own held layers count as holders: a re-cut stage may need some layers it holds and
        # some only others hold (nobody dials itself; those layers are copied from memory).
        self.local = {f"{LOCAL_HOLDER}#{i}": state for i, state in enumerate(local)}

    @property
    def name(self) -> str:
        return f"peers:{','.join(sorted({h.peer_id[-8:] for h in self.holders}))}"

    def segments(
        self, first: int, last: int, holders: Sequence[Holder] | None = None
    ) -> list[tuple[int, int, list[str]]]:
        """[a, b) pieces of [first, last), each with the holders covering all of it."""
        holders = self.holders if holders is None else holders
        cuts = sorted({first, last} | {x for h in holders for x in (h.first, h.last) if first < x < last})
        out: list[tuple[int, int, list[str]]] = []
        for a, b in itertools.pairwise(cuts):
            covering = [h.peer_id for h in holders if h.first <= a and b <= h.last]
            if not covering:
                raise StateError(f"no holder covers layers [{a}, {b})")
            if out and out[-1][2] == covering:  # same holders: one request instead of two
                out[-1] = (out[-1][0], b, covering)
            else:
                out.append((a, b, covering))
        return out

    def _local_holders(self, want: StateWant) -> list[Holder]:
        wanted = (want.job, want.model, want.seed, want.step)
        return [
            Holder(name, s.meta.first_layer, s.meta.last_layer)
            for name, s in self.local.items()
            if (s.meta.job, s.meta.model, s.meta.seed, s.meta.step) == wanted
        ]

    async def _fetch(self, want: StateWant) -> tuple[dict[str, torch.Tensor], bool]:
        """The wanted tensors, and whether all were pulled (none is a piece of this peer's held state)."""
        merged: dict[str, torch.Tensor] = {}
        owned = True
        n = want.model.n_layers
        for a, b, holders in self.segments(want.first, want.last, self.holders + self._local_holders(want)):
            part = StateWant(want.job, want.model, want.seed, want.step, a, b)
            mine = next((self.local[h] for h in holders if h in self.local), None)
            if mine is not None:  # in memory already: no transfer
                merged.update(select(rename(mine.tensors, mine.meta.first_layer), a, b, n))
                owned = False
            else:
                merged.update(await pull_state(self.streams, self.protocol, holders, part, self.cfg))
        check_covers(merged, want.first, want.last, n, self.name)
        return rename(merged, -want.first), owned

    async def _fetch_pruned(self, want: StateWant) -> tuple[dict[str, torch.Tensor], bool]:
        """``_fetch``; holders that refused a stream are dead, asked no more by this source's next tries
        (the error still names every one of them, so the caller reports them as suspects)."""
        try:
            return await self._fetch(want)
        except StateError as e:
            self._unreachable |= e.unreachable
            self.holders = [h for h in self.holders if h.peer_id not in self._unreachable]
            raise StateError(str(e), self._unreachable, e.settling) from e

    async def _fetch_settled(self, want: StateWant) -> tuple[dict[str, torch.Tensor], bool]:
        """``_fetch``, asked again while holders may still be settling (``transfer.copy.settled``): a
        hand-off's joiner asks before the old plan's peers reach its start step, and a dead holder among
        the live ones (a recent plan's peer) must not end the wait."""
        return await settled(lambda: self._fetch_pruned(want), self.cfg.settle_s, self.name)

    async def fetch(self, want: StateWant, timeout_s: float) -> FetchedState:
        try:
            tensors, owned = await asyncio.wait_for(
                self._fetch_settled(want), min(timeout_s, self.cfg.deadline_s)
            )
        except TimeoutError:
            raise StateError(f"{self.name}: no complete state within {timeout_s:.0f} s") from None
        return FetchedState(tensors, want.step, self.name, owned)


async def fetch_first(sources: Sequence[StateSource], want: StateWant, timeout_s: float) -> FetchedState:
    """The first source that delivers; ``StateError`` listing every source's failure if none does. A
    source that cannot answer is routine (a newcomer's own memory and disk hold nothing; a holder that
    left), so each failure is logged at INFO; the error, when no source answers, names them all."""
    faults: list[str] = []
    unreachable: set[str] = set()
    for source in sources:
        try:
            return await source.fetch(want, timeout_s)
        except StateError as e:
            logger.info("state source %s failed: %s; trying the next", source.name, e)
            faults.append(str(e))
            unreachable |= e.unreachable
    where = f"layers [{want.first}, {want.last}) at step {want.step}"
    raise StateError(f"no source has {where}: {faults}", unreachable)
