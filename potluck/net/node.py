"""A node of a potluck swarm on hivemind's DHT: start, publish signed records, fetch verified ones.

Peers, the coordinator and read-only clients all use this one class, so every record that enters or
leaves potluck code goes through ``envelope.seal`` / ``envelope.verify``. The node runs in the caller's
asyncio loop (hivemind's ``DHTNode`` directly, no extra process) and its p2pd daemon uses the potluck
identity as its libp2p key, so the DHT peer id equals the potluck peer id.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import shutil
import signal
import tempfile
from collections.abc import Callable, Collection, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P
from hivemind.utils import get_dht_time
from hivemind.utils.multiaddr import Multiaddr

from potluck import lifeline, logs
from potluck.aio import bounded
from potluck.net import push
from potluck.net.config import NetworkConfig
from potluck.net.relaycheck import relay_serves_bulk
from potluck.net.streams import Streams
from potluck.net.validator import PotluckValidator, verify_read
from potluck.protocol import envelope
from potluck.protocol.admission import BanList
from potluck.protocol.allocation import Allocation
from potluck.protocol.errors import BootstrapError, RecordError
from potluck.protocol.identity import Identity
from potluck.protocol.keys import ALLOCATION, BANS, dht_key
from potluck.protocol.records import Record

logger = logging.getLogger(__name__)

DHT_SHUTDOWN_S = 5.0  # bound on stopping the DHT node; p2pd is stopped after it either way
RELAY_TRIES = 6  # starts of p2pd until its relay passes the self-test (each passes ~2 in 3 here)


class SwarmNode:
    """One DHT node with potluck's validator, owned by one asyncio loop."""

    def __init__(
        self, p2p: P2P, node: DHTNode, identity: Identity, policy: envelope.TrustPolicy, tmp_dir: Path | None
    ) -> None:
        self.p2p, self.node, self.identity, self.policy = p2p, node, identity, policy
        self._tmp_dir = tmp_dir  # holds the derived p2pd key when the caller gave no key_dir
        self.validator: PotluckValidator = node.protocol.record_validator
        self.admission: bytes | None = None  # this node's encoded Admission, attached to what it publishes
        self.circuits: list[str] = []  # our addresses through relays, when reachability is "private"
        self.streams = Streams(p2p)  # pushed records (push.py)
        self._pushing: set[asyncio.Task[int]] = set()  # pushes under way (each bounded by its timeout)

    @classmethod
    async def start(
        cls,
        identity: Identity,
        policy: envelope.TrustPolicy,
        net: NetworkConfig,
        initial_peers: Sequence[str] = (),
        *,
        client_mode: bool = False,
        key_dir: Path | None = None,
    ) -> SwarmNode:
        """Start p2pd and a DHT node; join through ``initial_peers`` or raise ``BootstrapError``."""
        logs.adopt("hivemind")  # its records through potluck's handler, if the process configured one
        tmp_dir = Path(tempfile.mkdtemp(prefix="potluck-p2p-")) if key_dir is None else None  # mode 0700
        key_file = identity.write_libp2p_key((key_dir or tmp_dir or Path(".")) / f"{identity.peer_id}.p2pkey")
        nat = (not net.loopback_only) if net.nat_traversal is None else net.nat_traversal
        relays = relay_addresses(net, initial_peers)
        p2p_kwargs: dict[str, Any] = dict(
            host_maddrs=list(net.host_maddrs),
            announce_maddrs=list(net.announce_maddrs) or None,
            identity_path=str(key_file),
            check_if_identity_free=False,  # hivemind's check assumes RSA keys; ours are Ed25519
            startup_timeout=net.startup_timeout_s,
            use_relay=net.use_relay,
            use_auto_relay=net.use_auto_relay,
            auto_nat=nat,
            nat_port_map=nat,
            dht_mode="client" if client_mode else "server",
        )
        extra_args: tuple[str, ...] = ()
        if net.reachability == "private":
            # Static relays only: with discovery on, libp2p's autorelay waits minutes for 4 candidates
            # before it reserves a slot on fewer; hivemind offers no argument for this p2pd flag.
            p2p_kwargs.update(force_reachability="private", use_auto_relay=True, use_relay=True)
            if relays:
                p2p_kwargs["trusted_relays"] = list(relays)
                extra_args = ("-relayDiscovery=false",)
        elif net.reachability == "public":
            p2p_kwargs["force_reachability"] = "public"  # relay service on without AutoNAT's verdict
        try:
            p2p = await _start_p2p(list(initial_peers), p2p_kwargs, net.bootstrap_timeout_s, extra_args)
            if net.reachability == "public" and net.relay_check:
                p2p = await _with_working_relay(p2p, list(initial_peers), p2p_kwargs, net)
        except BaseException:
            _remove_tree(tmp_dir)
            raise
        try:
            node = await asyncio.wait_for(
                DHTNode.create(
                    p2p=p2p,
                    initial_peers=list(initial_peers) or None,
                    client_mode=client_mode,
                    record_validator=PotluckValidator(policy),
                    wait_timeout=net.request_timeout_s,
                    bootstrap_timeout=net.request_timeout_s,
                    cache_locally=False,  # a cached copy would outlive a withdrawn heartbeat
                ),
                timeout=net.bootstrap_timeout_s + net.request_timeout_s,
            )
        except BaseException:
            await p2p.shutdown()
            _remove_tree(tmp_dir)
            raise
        swarm_node = cls(p2p, node, identity, policy, tmp_dir)
        if net.reachability == "private":
            swarm_node.circuits = [f"{r}/p2p-circuit/p2p/{identity.peer_id}" for r in relays]
        return swarm_node

    @property
    def behind_nat(self) -> bool:
        return bool(self.circuits)

    async def visible_maddrs(self) -> list[str]:
        """Addresses others can dial, each ending in /p2p/<our peer id>; behind a NAT the circuits
        through our relays come first (libp2p lists relay addresses only when they look public)."""
        return self.circuits + [str(m) for m in await self.p2p.get_visible_maddrs()]

    async def publish(
        self,
        name: str,
        record: Record,
        ttl_s: float,
        subkey: Any = None,
        signer: Identity | None = None,
        push_to: Collection[str] = (),
    ) -> bool:
        """Sign and store ``record`` under this swarm's ``name`` key for ``ttl_s`` seconds; ``signer``:
        another key than the node's (the owner's tools sign as the coordinator from a node of their own).
        ``push_to``: peers that also get the signed record straight away (``push.py``; regular keys only),
        while it is stored."""
        expiration = get_dht_time() + ttl_s
        value = envelope.seal(
            signer or self.identity, self.policy.swarm_id, name, record, expiration, subkey, self.admission
        )
        if push_to and subkey is None:  # not waited for: a dead peer's push must not hold the store up
            sent = push.push(self.streams, self.policy.swarm_id, push_to, name, expiration, value)
            task = asyncio.ensure_future(sent)
            self._pushing.add(task)
            task.add_done_callback(self._pushing.discard)
        return bool(
            await self.node.store(dht_key(self.policy.swarm_id, name), value, expiration, subkey=subkey)
        )

    async def take_pushes(self, names: Callable[[], Sequence[str]], on_record: push.OnRecord) -> None:
        """Take records of the names ``names()`` lists pushed straight to this node (``push.py``),
        verified as a DHT read is, and hand each to ``on_record``."""
        await push.serve_pushes(self.streams, self.policy, names, on_record)

    async def stop_pushes(self) -> None:
        await self.streams.unserve(push.push_protocol(self.policy.swarm_id))

    async def fetch(self, name: str) -> list[envelope.Verified]:
        """All live, verified records under ``name`` (one per subkey; regular keys give at most one)."""
        found = await self.node.get(dht_key(self.policy.swarm_id, name), latest=True)
        if found is None:
            return []
        now = get_dht_time()
        items: list[tuple[Any, Any]] = (
            [(sk, v) for sk, v in found.value.items()] if isinstance(found.value, dict) else [(None, found)]
        )
        out: list[envelope.Verified] = []
        for subkey, item in items:
            try:
                out.append(verify_read(self.policy, name, subkey, item.value, item.expiration_time, now))
            except RecordError as e:
                logger.warning("dropping %s record %r: %s", name, subkey, e)
        return out

    async def read_bans(self) -> set[str]:
        """The peers the swarm's verified ban list names (empty when there is none)."""
        return {
            p for v in await self.fetch(BANS.name) if isinstance(v.record, BanList) for p in v.record.peers
        }

    async def read_allocation(self) -> Allocation | None:
        """The newest allocation round in the DHT (None: a one-job swarm, or none readable yet)."""
        found = [v.record for v in await self.fetch(ALLOCATION.name) if isinstance(v.record, Allocation)]
        return max(found, key=lambda r: (r.round, r.issued_at), default=None)

    def kill(self) -> None:
        """Last resort when a bounded shutdown ran out: end our p2pd child by its PID."""
        child = getattr(self.p2p, "_child", None)
        if child is not None and child.returncode is None:
            child.kill()
        _remove_tree(self._tmp_dir)

    async def shutdown(self) -> None:
        """Stop the DHT node and its p2pd daemon (hivemind reaps the daemon by PID)."""
        for task in list(self._pushing):
            task.cancel()
        try:
            await bounded(self.node.shutdown(), DHT_SHUTDOWN_S, "DHT node shutdown")
        except TimeoutError as e:
            logger.warning("%s", e)
        except Exception:  # shutdown must stay bounded whatever the node's state
            logger.exception("DHT node shutdown failed")
        await self.p2p.shutdown()
        _remove_tree(self._tmp_dir)


async def _with_working_relay(
    p2p: P2P, initial_peers: list[str], kwargs: dict[str, Any], net: NetworkConfig
) -> P2P:
    """``p2p``, or a restarted one, whose circuit relay carries bulk data (``net/relaycheck.py``)."""
    for attempt in range(1, RELAY_TRIES + 1):
        ok = await relay_serves_bulk(p2p, spawn_p2pd)
        if ok is None:
            logger.info("relay self-test did not run; relaying as started")
            return p2p
        if ok:
            logger.info("this node relays bulk data for NATed peers (self-test %d)", attempt)
            return p2p
        if attempt == RELAY_TRIES:
            break
        logger.warning(
            "this node's relay cut a test transfer short (p2pd's default relay service, 128 KiB per "
            "circuit, won its start-up race); restarting p2pd (%d of %d)",
            attempt,
            RELAY_TRIES,
        )
        await p2p.shutdown()
        p2p = await _start_p2p(initial_peers, kwargs, net.bootstrap_timeout_s)
    logger.warning(
        "this node's relay still cuts transfers short: NATed peers can only send it small messages"
    )
    return p2p


async def spawn_p2pd(kwargs: dict[str, Any], extra_args: tuple[str, ...] = ()) -> P2P:
    """A bare p2pd (no DHT node) that dies with this process; ``extra_args``: flags hivemind lacks."""
    with p2pd_dies_with_this_process(extra_args):
        p2p = await P2P.create(**kwargs)
    _guard_p2pd(p2p)
    return p2p


def relay_addresses(net: NetworkConfig, initial_peers: Sequence[str]) -> list[str]:
    """The relays a NATed node reserves a slot on: the configured ones, else the bootstrap peers; only
    addresses naming the relay's peer id (a circuit address needs it)."""
    return [a for a in (net.relays or tuple(initial_peers)) if "/p2p/" in a]


async def _start_p2p(
    initial_peers: list[str], kwargs: dict[str, Any], timeout_s: float, extra_args: tuple[str, ...] = ()
) -> P2P:
    """p2pd refuses to start when no bootstrap peer answers; retry until ``timeout_s``, then explain."""
    for addr in initial_peers:
        try:
            Multiaddr(addr)
        except Exception:
            raise BootstrapError(f"bootstrap address {addr!r} is not a valid multiaddr") from None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay, last_error = 0.5, ""
    while True:
        try:
            with p2pd_dies_with_this_process(extra_args):
                p2p = await P2P.create(initial_peers=initial_peers or None, **kwargs)
            _guard_p2pd(p2p)
            return p2p
        except Exception as e:
            last_error = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            if not initial_peers or "bootstrap" not in last_error or loop.time() + delay > deadline:
                break
            logger.info("bootstrap peers not reachable yet (%s); retrying in %.1f s", last_error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)
    if initial_peers and "bootstrap" in last_error:
        raise BootstrapError(
            f"could not reach any bootstrap peer within {timeout_s:.0f} s: {', '.join(initial_peers)}.\n"
            "Check that the coordinator is running and that this machine can reach those addresses "
            "(firewall, VPN). If the coordinator is behind NAT it must announce a public address "
            "(`potluck launch --announce-maddrs /ip4/PUBLIC_IP/tcp/PORT`); if you are behind NAT, "
            "`--reachability private` makes you reachable through relays."
        )
    raise BootstrapError(f"the p2p daemon failed to start: {last_error}")


# Set while hivemind's P2P.create runs in this task: the spawn hook below acts only then, so no other
# subprocess of this process is touched.
_SPAWNING_P2PD: contextvars.ContextVar[bool] = contextvars.ContextVar("potluck_spawning_p2pd", default=False)
_EXTRA_ARGS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("potluck_p2pd_args", default=())


@contextlib.contextmanager
def p2pd_dies_with_this_process(extra_args: tuple[str, ...] = ()) -> Iterator[None]:
    """Make the p2pd daemons that hivemind's ``P2P.create`` spawns inside this block die with us.

    Why: hivemind 1.1.12 (``hivemind/p2p/p2p_daemon.py``, ``P2P.create``) starts p2pd with
    ``asyncio.subprocess.create_subprocess_exec`` and offers no
    argument to pass a ``preexec_fn``; without one, a SIGKILLed potluck process (OOM killer, a closed
    container) leaves its p2pd running for good. So we wrap that function, once, and while this block is
    active in the current task the wrapper adds ``lifeline.preexec()`` (PR_SET_PDEATHSIG = SIGKILL: p2pd
    holds no state worth a graceful exit). The loop thread forks p2pd, and it lives as long as the node.
    Where the kernel lacks PDEATHSIG, ``lifeline.after_spawn`` starts a watchdog once the PID is known.
    ``extra_args`` are p2pd flags hivemind has no argument for, appended to its command line.
    """
    _install_spawn_hook()
    token = _SPAWNING_P2PD.set(True)
    args_token = _EXTRA_ARGS.set(extra_args)
    try:
        yield
    finally:
        _EXTRA_ARGS.reset(args_token)
        _SPAWNING_P2PD.reset(token)


_HOOKED_PIDS: set[int] = set()  # p2pd PIDs spawned through the hook with PR_SET_PDEATHSIG set


def _guard_p2pd(p2p: P2P) -> None:
    """If the hook did not see this p2pd (no PDEATHSIG here, or hivemind changed how it spawns), start
    lifeline's watchdog for it instead, so the guarantee holds either way."""
    child = getattr(p2p, "_child", None)
    if child is None:
        return
    if child.pid in _HOOKED_PIDS:
        _HOOKED_PIDS.discard(child.pid)
        return
    if lifeline.PDEATHSIG_AVAILABLE:
        logger.warning(
            "p2pd (pid %d) was not spawned through potluck's hook; guarding it with a watchdog", child.pid
        )
    lifeline.watch(child.pid)


def _install_spawn_hook() -> None:
    original: Callable[..., Coroutine[Any, Any, asyncio.subprocess.Process]]
    original = asyncio.subprocess.create_subprocess_exec
    if getattr(original, "_potluck_p2pd_hook", False):
        return

    async def create_subprocess_exec(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        hook = _SPAWNING_P2PD.get() and kwargs.get("preexec_fn") is None
        if hook:
            kwargs["preexec_fn"] = lifeline.preexec(signal.SIGKILL)
            args = (*args, *_EXTRA_ARGS.get())
        proc = await original(*args, **kwargs)
        if hook and kwargs["preexec_fn"] is not None:
            _HOOKED_PIDS.add(proc.pid)
        return proc

    create_subprocess_exec._potluck_p2pd_hook = True  # type: ignore[attr-defined]
    asyncio.subprocess.create_subprocess_exec = create_subprocess_exec


def _remove_tree(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
