import pytest

from potluck.protocol.envelope import TrustPolicy
from potluck.protocol.identity import Identity
from potluck.protocol.jobspec import BatchSpec, JobSpec, ModelSpec
from potluck.protocol.records import Hardware, PeerRecord

NOW = 1_800_000_000.0


def make_hardware(**kw):
    base = dict(
        device_kind="cpu",
        device_name="test cpu",
        memory_total_bytes=8 << 30,
        memory_free_bytes=4 << 30,
        cpu_cores=2,
        tflops_fp32=0.2,
        tflops_bf16=0.4,
    )
    base.update(kw)
    return Hardware(**base)


def make_peer_record(ident: Identity, **kw) -> PeerRecord:
    base = dict(
        peer_id=ident.peer_id, hardware=make_hardware(), maddrs=["/ip4/127.0.0.1/tcp/1"], issued_at=NOW
    )
    base.update(kw)
    return PeerRecord(**base)


def make_job(**kw) -> JobSpec:
    base = dict(
        name="tiny",
        model=ModelSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=256, seq_len=32),
        batch=BatchSpec(tokens_per_step=1024, micro_batch_size=4),
    )
    base.update(kw)
    return JobSpec(**base)


@pytest.fixture
def coordinator() -> Identity:
    return Identity.generate()


@pytest.fixture
def policy(coordinator: Identity) -> TrustPolicy:
    return TrustPolicy("swarm-a", coordinator.public_key)
