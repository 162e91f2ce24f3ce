"""Who may take part, the coordinator's side: the door that trades join tokens for admissions, and the ban
list and token uses it keeps in the DHT.

A peer opens a stream of ``potluck/<swarm>/admit/1`` and sends one CONTROL frame, msgpack
``{"token": str | None}``; the coordinator answers with a CONTROL frame holding the encoded
``Admission`` (``protocol/admission.py``), or an ERROR frame saying why not. The peer is the stream's
authenticated libp2p id, so an admission can only be asked for oneself.

A job owner (``potluck launch --join``) adds ``"job": name`` to its request: the admission then also
names the job (``owner_role``), which lets it sign that job's records. A job name belongs to the first
admitted key that asks for it (``jobs``; the swarm's own job is never given away).

``AdmissionDesk.decide`` is the policy (pure but for the use counts it keeps): banned peers never; an
open swarm admits anyone; otherwise the token must be signed by this coordinator, for this swarm, not
expired, and within its ``max_uses`` (a peer renewing with the token it joined with uses nothing up).
The uses of limited tokens are published as a coordinator-signed ``TokenUses`` record (the service keeps
it fresh), and a restarted coordinator reads them back before it admits anyone: no count lives only on
the coordinator's disk or in its memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgpack
from hivemind.utils import get_dht_time

from potluck.aio import bounded
from potluck.coordinator.config import AdmitConfig, CoordinatorConfig
from potluck.net.admit import admit_protocol
from potluck.net.node import SwarmNode
from potluck.net.streams import Streams
from potluck.protocol.admission import (
    MAX_BANS,
    MAX_TOKENS_KEPT,
    MAX_USERS_KEPT,
    ROLES,
    Admission,
    BanList,
    JoinToken,
    TokenUse,
    TokenUses,
    owner_role,
)
from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.errors import AdmissionError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import BANS, TOKENS
from potluck.protocol.wire import Frame, MsgType, read_frame, write_frame

logger = logging.getLogger(__name__)


class AdmissionDesk:
    def __init__(self, identity: Identity, swarm_id: str, cfg: AdmitConfig, banned: set[str]) -> None:
        self.identity, self.swarm_id, self.cfg, self.banned = identity, swarm_id, cfg, banned
        self.uses: dict[str, set[str]] = {}  # limited token id -> the peers it admitted
        self.expires: dict[str, float] = {}  # limited token id -> when it expires
        self.version = 0  # counts changes to the uses, so the service knows when to publish them
        self.granted = 0
        self.refused = 0
        self.jobs: dict[str, str] = {}  # job name -> the peer id that owns it (launch --join)
        self.home_job: str | None = None  # the swarm's own job: never anyone else's

    def claim(self, job: str, peer: str) -> None:
        """Give ``job`` to ``peer`` unless another owns it (or it is the swarm's own)."""
        owner = self.jobs.get(job)
        if job == self.home_job or (owner is not None and owner != peer):
            raise AdmissionError(f"job name {job!r} is taken in this swarm")
        self.jobs[job] = peer

    def decide(self, peer: str, token: object, now: float, job: object = None) -> Admission:
        """The admission for ``peer`` presenting ``token`` at ``now`` (owning ``job`` when given, a job
        name); ``AdmissionError`` says why not."""
        if peer in self.banned:
            raise AdmissionError("this peer is banned from the swarm")
        if job is not None and not isinstance(job, str):
            raise AdmissionError("malformed job name")
        roles: tuple[str, ...] = ROLES
        if not self.cfg.open or token is not None:
            claims = JoinToken.verify(token, self.swarm_id, self.identity.public_key, now)
            if claims.max_uses:
                users = self.uses.setdefault(claims.token_id, set())
                if peer not in users and len(users) >= claims.max_uses:
                    raise AdmissionError(
                        f"join token used up ({claims.max_uses} peers): ask for a fresh invite"
                    )
                if peer not in users:
                    users.add(peer)
                    self.expires[claims.token_id] = claims.expires
                    self.version += 1
            roles = claims.roles
        if job is not None:
            role = owner_role(job)
            self.claim(job, peer)
            roles = (*roles, role)
        return Admission.issue(self.identity, self.swarm_id, peer, now + self.cfg.ttl_s, roles)

    def record(self, now: float) -> TokenUses:
        """The uses of the limited tokens still valid at ``now`` (the soonest to expire dropped first)."""
        live = sorted((t for t, exp in self.expires.items() if exp > now), key=lambda t: -self.expires[t])
        tokens = [
            TokenUse(token_id=t, expires=self.expires[t], peers=sorted(self.uses[t])[:MAX_USERS_KEPT])
            for t in live[:MAX_TOKENS_KEPT]
        ]
        return TokenUses(tokens=tokens, issued_at=now)

    def restore(self, record: TokenUses, now: float) -> None:
        """Count on from a published ``record`` (a restarted coordinator's first read)."""
        for t in record.tokens:
            if t.expires > now:
                self.uses.setdefault(t.token_id, set()).update(t.peers)
                self.expires[t.token_id] = max(t.expires, self.expires.get(t.token_id, 0.0))

    async def serve(self, streams: Streams, now: Callable[[], float]) -> None:
        async def handle(peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            timeout = self.cfg.timeout_s
            frame = await read_frame(reader, timeout, expect={MsgType.CONTROL})
            try:
                ask = msgpack.unpackb(frame.payload, raw=False, max_str_len=1024, max_map_len=4)
                if not isinstance(ask, dict):
                    raise AdmissionError("malformed admission request")
                admission = self.decide(peer, ask.get("token"), now(), ask.get("job"))
            except AdmissionError as e:
                self.refused += 1
                logger.warning("refused to admit %s: %s", peer, e)
                await write_frame(writer, Frame(MsgType.ERROR, str(e).encode()[:4000]), timeout)
                return
            except Exception:
                self.refused += 1
                await write_frame(writer, Frame(MsgType.ERROR, b"malformed admission request"), timeout)
                return
            self.granted += 1
            await write_frame(writer, Frame(MsgType.CONTROL, admission.encode()), timeout)

        await streams.serve(admit_protocol(self.swarm_id), handle)


# The ban list and the token uses, kept in the DHT. The coordinator merges the ban list it reads (``potluck
# ban`` may have added to it) with its own and keeps its own published: peers refuse banned peers' records
# from their next read of it. It keeps the tokens' uses published too, and reads them back before it admits
# anyone after a restart, so that no count lives only on the coordinator's disk or in its memory.
logger = logging.getLogger(__name__)


async def restore_token_uses(node: SwarmNode, desk: AdmissionDesk, read_timeout_s: float) -> None:
    """Before admitting anyone: count on from the token uses an earlier run of ours published."""
    try:
        found = await bounded(node.fetch(TOKENS.name), read_timeout_s, "reading token uses")
    except Exception as e:  # a first start, or an unreadable DHT: count from here
        logger.warning("token uses not read (%s); counting from zero", e)
        return
    for v in found:
        if isinstance(v.record, TokenUses):
            desk.restore(v.record, get_dht_time())


async def keep_access(
    node: SwarmNode,
    desk: AdmissionDesk,
    policy: TrustPolicy,
    cfg: CoordinatorConfig,
    ban: Callable[[str, str], None],
) -> None:
    """Each poll: take in the bans read from the DHT (``ban(peer, why)``), republish ours when it
    changed or a third of its TTL passed, and the token uses likewise. Runs until cancelled."""
    published: frozenset[str] = frozenset()
    refreshed = tokens_at = 0.0  # monotonic times of the last publications
    uses_published = 0  # the desk's version last published
    while True:
        try:
            due = time.monotonic() - tokens_at > cfg.bans_ttl_s / 3
            version = desk.version
            if desk.expires and (version != uses_published or due):
                uses = desk.record(get_dht_time())
                if await node.publish(TOKENS.name, uses, cfg.bans_ttl_s):
                    uses_published, tokens_at = version, time.monotonic()
            for peer in await node.read_bans() - policy.banned:
                ban(peer, "on the swarm's ban list")
            due = time.monotonic() - refreshed > cfg.bans_ttl_s / 3
            if policy.banned and (published != policy.banned or due):
                bans = BanList(peers=sorted(policy.banned)[-MAX_BANS:], issued_at=get_dht_time())
                if await node.publish(BANS.name, bans, cfg.bans_ttl_s):
                    published, refreshed = frozenset(policy.banned), time.monotonic()
        except Exception:
            logger.exception("keeping the ban list and token uses failed")
        await asyncio.sleep(cfg.poll_interval_s)
