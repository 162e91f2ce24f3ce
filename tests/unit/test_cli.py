"""CLI behaviour that needs no network: help, and errors that are one clear line."""

import logging
import os
import time

import pytest
from typer.testing import CliRunner

import potluck.cli as cli
from potluck import logs
from potluck.cli import app
from potluck.coordinator.errors import PlanningError
from potluck.protocol.admission import JoinToken
from potluck.protocol.identity import Identity
from potluck.protocol.invite import Invite

runner = CliRunner()


def test_help_lists_subcommands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for cmd in ("peer", "launch", "status", "demo"):
        assert cmd in result.output


def test_garbage_invite_is_a_clear_error():
    result = runner.invoke(app, ["status", "--join", "garbage"])
    assert result.exit_code == 2
    assert "not a potluck invite" in result.output


def test_loose_key_permissions_refused(tmp_path):
    key = tmp_path / "id.pem"
    Identity.generate().save(key)
    os.chmod(key, 0o644)
    invite = Invite("swarm-a", (f"/ip4/127.0.0.1/tcp/1/p2p/{Identity.generate().peer_id}",), b"k" * 32)
    result = runner.invoke(app, ["peer", "--join", invite.encode(), "--identity", str(key)])
    assert result.exit_code == 2
    assert "chmod 600" in result.output


def test_bad_job_file_names_field(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\n')
    result = runner.invoke(app, ["launch", str(job)])
    assert result.exit_code == 2
    assert "field `model`" in result.output


def test_a_codec_chain_this_release_cannot_build_is_refused_at_launch(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "x"\n[model]\nn_layers = 2\nd_model = 64\nn_heads = 4\nvocab_size = 256\nseq_len = 16\n'
        "[batch]\ntokens_per_step = 64\nmicro_batch_size = 2\n"
        '[compression]\nsync_every = 4\nouter = "int9|zstd"\n'
    )
    result = runner.invoke(app, ["launch", str(job)])
    assert result.exit_code == 2
    assert "compression.outer = 'int9|zstd'" in " ".join(result.output.split())


def test_log_level_and_json_lines_from_the_environment(monkeypatch):
    """The CLI configures logging once: POTLUCK_LOGLEVEL sets the level, POTLUCK_LOGFORMAT=json the format."""
    monkeypatch.setenv("POTLUCK_LOGLEVEL", "ERROR")
    monkeypatch.setenv("POTLUCK_LOGFORMAT", "json")
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        result = runner.invoke(app, ["status", "--join", "garbage"])
        assert result.exit_code == 2
        assert root.level == logging.ERROR
        assert isinstance(logs._handler.formatter, logs.JsonFormatter)
    finally:
        root.handlers[:], root.level = saved
        logs._handler = None


def test_a_potluck_error_escaping_a_command_is_one_line_and_exit_1(monkeypatch, capsys):
    """main() catches PotluckError (the root of every deliberate error): no traceback, its message."""

    def command() -> None:
        raise PlanningError("no feasible shape: add peers or shrink the model")

    monkeypatch.setattr(cli, "app", command)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "error:" in err and "no feasible shape: add peers" in err and "Traceback" not in err


def test_a_bug_keeps_its_traceback(monkeypatch):
    def command() -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "app", command)
    with pytest.raises(KeyError):
        cli.main()


def test_invite_mints_a_counted_token_only_with_the_coordinators_key(tmp_path):
    key_file = tmp_path / "coordinator.pem"
    key = Identity.load_or_create(key_file)
    addr = f"/ip4/127.0.0.1/tcp/1/p2p/{key.peer_id}"
    base = Invite("swarm-a", (addr,), key.public_key, token=None).encode()
    out = runner.invoke(app, ["invite", base, "--identity", str(key_file), "--uses", "1", "--hours", "2"])
    assert out.exit_code == 0, out.output
    fresh = Invite.decode(out.output.strip().splitlines()[-1])
    assert (fresh.swarm_id, fresh.bootstrap, fresh.coordinator_key) == ("swarm-a", (addr,), key.public_key)
    claims = JoinToken.verify(fresh.token, "swarm-a", key.public_key, now=time.time())
    assert claims.max_uses == 1 and 7000 < claims.expires - time.time() <= 7200
    other = tmp_path / "other.pem"
    Identity.load_or_create(other)
    out = runner.invoke(app, ["invite", base, "--identity", str(other)])
    assert out.exit_code == 2 and "only its owner mints invites" in out.output
