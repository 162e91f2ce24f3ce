"""Asking the coordinator for an admission (the peer's side of ``coordinator/admission.py``)."""

from __future__ import annotations

import msgpack

from potluck.net.streams import Streams
from potluck.protocol.admission import Admission
from potluck.protocol.envelope import TrustPolicy, check_member
from potluck.protocol.errors import AdmissionError, WireError
from potluck.protocol.identity import peer_id_from_public_key
from potluck.protocol.wire import Frame, MsgType, read_frame, write_frame


def admitted(policy: TrustPolicy, peer: str, admission: bytes | None, now: float) -> bool:
    """Whether ``peer`` may be served what the swarm's peers share (state, checkpoint copies): the
    coordinator, or a peer that passes ``envelope.check_member`` (the same test as its records)."""
    if peer == peer_id_from_public_key(policy.coordinator_key):
        return True
    try:
        check_member(policy, peer, admission, now)
    except AdmissionError:
        return False
    return True


def admit_protocol(swarm_id: str) -> str:
    """The stream protocol on which the coordinator trades join tokens for admissions."""
    return f"potluck/{swarm_id}/admit/1"


async def ask_admission(
    streams: Streams,
    coordinator: str,
    swarm_id: str,
    token: str | None,
    timeout_s: float,
    job: str | None = None,
) -> Admission:
    """Trade ``token`` for an admission at the coordinator (one that owns ``job``, when given).
    ``AdmissionError``: refused (the reason is the coordinator's); ``WireError``: the coordinator could
    not be reached or did not answer in time."""
    reader, writer = await streams.open(coordinator, admit_protocol(swarm_id), timeout_s)
    ask: dict[str, str | None] = {"token": token}
    if job is not None:
        ask["job"] = job
    try:
        await write_frame(writer, Frame(MsgType.CONTROL, msgpack.packb(ask)), timeout_s)
        try:
            frame = await read_frame(reader, timeout_s, expect={MsgType.CONTROL})
        except WireError as e:
            if "reported an error" in str(e):
                raise AdmissionError(str(e).split(": ", 1)[-1]) from None
            raise
    finally:
        writer.close()
    admission = Admission.decode(frame.payload)
    if admission.peer_id != streams.peer_id or admission.swarm_id != swarm_id:
        raise AdmissionError("the coordinator's admission is for another peer or swarm")
    return admission
