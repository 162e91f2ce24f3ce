"""What a volunteer is shown of a job (``potluck launch`` under the invite, ``potluck status``)."""

from __future__ import annotations

from potluck.cli.views.model import job_lines
from potluck.protocol.jobspec import JobSpec

BATCH = {"tokens_per_step": 1024, "micro_batch_size": 2}


def test_a_native_job_on_generated_data() -> None:
    job = JobSpec(
        name="n",
        model={"n_layers": 4, "d_model": 128, "n_heads": 4, "vocab_size": 256, "seq_len": 128},
        batch=BATCH,
    )
    model, memory, data, download = job_lines(job)
    assert model.startswith("model: potluck's decoder, 0.9M parameters, 4 layers")
    assert "the whole model on one peer" in memory and data == "data: generated on each peer"
    whole = float(memory.split("about ")[1].split(" GB")[0])
    half = float(job_lines(job, n_stages=2)[1].split("about ")[1].split(" GB")[0])
    assert half < whole  # a stage of 2 of 4 layers needs less than the whole model
    assert "MB to start" in download


def test_a_hugging_face_model_on_shipped_data() -> None:
    model = {
        "n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": 4, "vocab_size": 32000, "seq_len": 512,
        "family": "llama", "from": "models/small-llama", "ffn_width": 2048,
    }  # fmt: skip
    data = {"source": "directory", "path": "corpus", "fingerprint": "ab" * 32, "tokens": 10_000_000}
    lines = job_lines(JobSpec(name="hf", model=model, batch=BATCH, data=data), n_stages=2)
    assert lines[0].startswith("model: llama from models/small-llama, ") and "12 heads / 4 kv" in lines[0]
    assert "a stage of 6 of 12 layers" in lines[1]
    assert lines[2] == (
        "data: corpus shipped over the swarm, 10,000,000 tokens in 3 shards of 8.4 MB (fingerprint abababababab)"
    )
    assert "the data its first steps read (25 MB)" in lines[3]
