"""A job ``from`` a Hugging Face model: a Llama made by ``transformers`` that only the job owner holds
(beside its job file) is continued by two peers, each in its own directory with nothing of the model.

``potluck launch`` writes the model's weights as step 0 of the owner's checkpoint copy; each peer pulls
its stage's layers from there over the swarm; the job trains to its end; ``potluck export`` of the
final checkpoint loads in ``transformers``, its weights are the original ones moved a few small steps
(not a seeded init), and its greedy continuation of a prompt is what ``potluck generate`` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from potluck.model.data import ByteTokenizer
from tests.helpers.hfmodels import make_model
from tests.helpers.swarm import potluck_cli, run_to_the_end, write_job

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS, LR = 6, 1e-4
PROMPT = "the pot "


def test_a_swarm_continues_a_hugging_face_model_and_exports_it(tmp_path: Path) -> None:
    owner = tmp_path / "owner"  # the job owner's machine: the job file, the model, its checkpoint copy
    # 256 ids: the job's byte tokenizer; grouped queries, untied, Llama 3.1 rotary scaling
    original = make_model(
        "llama", owner / "tiny-llama", seed=7, shape={"vocab_size": 256, "rope_scaling": None}
    )
    job = write_job(
        owner / "job.toml",
        {"name": "hf-continue", "steps": STEPS, "min_peers": 2},
        model={"from": "tiny-llama", "seq_len": 16},
        batch={"tokens_per_step": 64, "micro_batch_size": 2},
        optimizer={"lr": LR, "warmup_steps": 0},
        data={"generated_chars": 20000},
        checkpoint={"dir": str(owner / "ckpt"), "interval": 3},
        limits={"stages": 2, "replicas": 1},
    )
    with run_to_the_end(tmp_path, job, "hf-test", STEPS) as (swarm, _):
        for name in ("a", "b"):  # each pulled its layers of step 0 over the swarm
            log = swarm.procs[name].log.read_text(errors="replace")
            assert "resumed at step 0 from peers" in log, log[-3000:]

    out = tmp_path / "exported"
    done = potluck_cli("export", str(owner / "ckpt"), str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"step {STEPS}:" in done.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    moved = max(
        (a - b).abs().max().item()
        for a, b in zip(loaded.state_dict().values(), original.state_dict().values(), strict=True)
    )
    # AdamW moves a weight about lr a step: trained from the model's weights, not from a seeded init
    assert 0 < moved < 3 * STEPS * LR, moved

    ids = ByteTokenizer().encode(PROMPT)
    with torch.no_grad():
        greedy = loaded.generate(
            torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0, attention_mask=None
        )[0].tolist()
    said = potluck_cli(
        "generate", str(owner / "ckpt"), "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "8"
    )
    assert said.returncode == 0, said.stderr
    assert said.stdout.rstrip("\n") == ByteTokenizer().decode(greedy)
