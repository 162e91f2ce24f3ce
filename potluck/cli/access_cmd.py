"""``potluck invite`` and ``potluck ban``: the job owner's hand on who may join, with the coordinator's key.

Both work from the owner's machine with the key that signs the job, whether or not the coordinator runs
there: a token is minted offline (the coordinator checks its signature and counts its uses), and a ban
is a signed record in the swarm's DHT that the running coordinator merges into its own list.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import typer

from potluck.cli.common import fail, network_config, parse_invite, write_private_text
from potluck.coordinator.config import DEFAULT_HOME

KEY_HELP = "The coordinator's Ed25519 key file (the one `potluck launch` used)."


def invite(
    join: str = typer.Argument(..., help="An invite of the swarm (or @FILE), e.g. the one launch printed."),
    identity: Path = typer.Option(DEFAULT_HOME / "coordinator.pem", help=KEY_HELP),
    uses: int = typer.Option(1, "--uses", min=0, help="Peers the new invite admits (0: any number)."),
    hours: float = typer.Option(24.0, "--hours", min=0.001, help="Hours the new invite can be used."),
    out: Path = typer.Option(None, "--out", help="Also write the new invite to this file (0600)."),
) -> None:
    """Mint a fresh invite for a running swarm: the same swarm, a new join token."""
    from hivemind.utils import get_dht_time

    from potluck.protocol.admission import JoinToken
    from potluck.protocol.identity import Identity

    base = parse_invite(join)
    key = Identity.load_or_create(identity) if identity.exists() else None
    if key is None or key.public_key != base.coordinator_key:
        raise fail(f"{identity} is not the key of this swarm's coordinator: only its owner mints invites")
    token = JoinToken.mint(key, base.swarm_id, get_dht_time() + hours * 3600.0, uses)
    text = type(base)(base.swarm_id, base.bootstrap, base.coordinator_key, token, base.mqtt).encode()
    if out is not None:
        write_private_text(out, text)
    print(text, flush=True)  # noqa: T201 - the invite goes to stdout so it can be piped


def ban(
    peers: list[str] = typer.Argument(..., help="Peer ids to ban."),
    join: str = typer.Option(..., "--join", help="An invite of the swarm (or @FILE)."),
    identity: Path = typer.Option(DEFAULT_HOME / "coordinator.pem", help=KEY_HELP),
    timeout: float = typer.Option(30.0, min=1.0, help="Seconds to reach the swarm and store the list."),
) -> None:
    """Ban peers: every node refuses their records from its next read of the ban list (one heartbeat)."""
    from potluck.net.node import SwarmNode
    from potluck.protocol.errors import IdentityError
    from potluck.protocol.identity import Identity, public_key_from_peer_id

    base = parse_invite(join)
    key = Identity.load_or_create(identity) if identity.exists() else None
    if key is None or key.public_key != base.coordinator_key:
        raise fail(f"{identity} is not the key of this swarm's coordinator: only its owner bans")
    for p in peers:
        try:
            public_key_from_peer_id(p)
        except IdentityError as e:
            raise fail(str(e)) from None

    async def main() -> int:
        from hivemind.utils import get_dht_time

        from potluck.aio import bounded
        from potluck.protocol.admission import BanList
        from potluck.protocol.envelope import TrustPolicy
        from potluck.protocol.keys import BANS

        policy = TrustPolicy(base.swarm_id, base.coordinator_key)
        net = network_config(None, None, "/ip4/127.0.0.1/tcp/0", timeout)
        # a node of its own (the coordinator's id is taken by the coordinator), signing as the coordinator
        node = await SwarmNode.start(Identity.generate(), policy, net, base.bootstrap, client_mode=True)
        try:
            banned = set(peers) | await bounded(node.read_bans(), timeout, "reading the ban list")
            record = BanList(peers=sorted(banned), issued_at=get_dht_time())
            store = node.publish(BANS.name, record, 600.0, signer=key)
            stored = await bounded(store, timeout, "storing the ban list")
            return len(banned) if stored else -1
        finally:
            await node.shutdown()

    started = time.monotonic()
    n = asyncio.run(main())
    if n < 0:
        raise fail("no DHT node stored the ban list; is the swarm running?", code=1)
    typer.echo(f"{n} peer(s) banned from swarm {base.swarm_id} ({time.monotonic() - started:.1f} s)")


def register(app: typer.Typer) -> None:
    app.command("invite")(invite)
    app.command("ban")(ban)
