"""The harness that tests and benchmarks share reads the checkout's files: its paths must name files
that exist (a move of the harness once left ``TINY_JOB`` pointing into ``potluck/``, and only the
process swarms that read it found out)."""

from potluck.protocol.jobspec import load_job
from potluck.testbed.harness.starts import TINY_JOB, tiny_job_file


def test_the_tiny_job_the_start_harness_launches_exists_and_parses(tmp_path):
    assert TINY_JOB.is_file(), TINY_JOB
    job = load_job(tiny_job_file(tmp_path / "job.toml", 3, tmp_path / "ckpt"))
    assert job.steps == 3
