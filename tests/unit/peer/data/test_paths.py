"""A signed job cannot point a volunteer's peer at its files: job paths are names under the peer's
state directory, and the volunteer's own --data-dir / --tokenizer win."""

from pathlib import Path

import pytest

from potluck.peer.data.paths import DataPathError, local_data
from potluck.protocol.jobspec import DataSpec

STATE = Path("/home/v/.potluck/peer")


@pytest.mark.parametrize(
    "path", ["/etc", "/home/v/.ssh", "../../.ssh", "texts/../../../etc", "~/secrets", "..\\..\\windows"]
)
def test_a_job_cannot_name_a_path_outside_the_peers_data_dir(path):
    with pytest.raises(DataPathError, match="reads no path a job chooses"):
        local_data(DataSpec(source="directory", path=path), STATE, None, None)
    with pytest.raises(DataPathError, match="--tokenizer"):
        local_data(DataSpec(tokenizer=path), STATE, None, None)


def test_relative_names_land_under_the_state_dir_and_the_owners_flags_win():
    spec = DataSpec(source="directory", path="wiki/en", tokenizer="tok/tokenizer.json")
    got = local_data(spec, STATE, None, None)
    assert got.path == str(STATE / "data" / "wiki/en")
    assert got.tokenizer == str(STATE / "data" / "tok/tokenizer.json")
    mine = local_data(spec, STATE, Path("/mnt/corpus"), Path("/mnt/tok.json"))
    assert (mine.path, mine.tokenizer) == ("/mnt/corpus", "/mnt/tok.json")
    # even an absolute job path is fine when the volunteer says where the data is
    assert local_data(DataSpec(source="directory", path="/etc"), STATE, Path("/mnt/c"), None).path == "/mnt/c"


def test_generated_data_needs_no_path():
    got = local_data(DataSpec(), STATE, None, None)
    assert got.source == "generated" and got.path is None and got.tokenizer is None
