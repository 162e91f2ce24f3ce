"""Guardrails on the tree: layers, no import cycles, no hidden imports, light entry points, pure policy,
folders and files a reader can hold.

The rules are those of docs/architecture.md ("Rules the tests enforce"). The checks live in
``tests/helpers/layout.py`` and parse every module (never import it), so a violation anywhere fails here
with the file, the line and the rule. Each rule is also run on a scratch tree with one violation planted,
so a check that stopped seeing anything would fail too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.layout import (
    Layers,
    Tree,
    crowded_folders,
    import_cycles,
    impure_imports,
    inline_imports,
    layer_violations,
    long_files,
    unknown_parts,
)

REPO = Path(__file__).resolve().parents[2]

# Rank of each part: a module imports only from parts of a lower rank, or from its own part. Parts of
# equal rank never import each other (peer and coordinator meet only in protocol).
RANK = {
    "root": 0,  # potluck/*.py: errors, aio, logs, lifeline, compat, __init__
    "protocol": 1,
    "compression": 1,
    "net": 2,
    "model": 2,
    "classpar": 2,  # class-parallel sub-networks and erasure codes: one machine, no network
    "telemetry": 2,
    "transfer": 3,  # stage state over the swarm: used by peers and the coordinator alike
    "peer": 4,
    "coordinator": 4,
    "classpar.swarm": 5,  # the class-parallel job kind: plugged into the peer and the coordinator
    "testbed": 5,
    "sim": 6,  # the simulator drives the real planner and draws links from testbed's home model
    "cli": 7,
}
FORBIDDEN = {
    "sim": frozenset({"net", "peer", "transfer"}),  # a simulation opens no connection
    "coordinator": frozenset({"model"}),  # the coordinator plans a model it never builds
}
LAYERS = Layers(RANK, FORBIDDEN, entry_points=frozenset({"potluck.__main__"}))
# Optional dependencies may be imported where they are used, so a missing extra fails only that path.
OPTIONAL = frozenset(
    {"triton", "pyarrow", "tokenizers", "matplotlib", "potluck.compression.kernels.triton_kernels"}
)
# Listed exceptions to "no imports inside functions", each with its reason. Keep this short.
INLINE_ALLOWED = frozenset(
    {
        # dynamo's config is needed only when the codec path is compiled (>= 1M elements); importing it
        # at the top would load the compiler stack for every user of the codecs.
        ("potluck.compression.kernels.cpu", "torch._dynamo.config"),
    }
)
LAZY = frozenset({"cli"})  # command bodies import what they need, so `potluck --help` is fast
# Modules that are pure policy: time comes in as `now`, no event loop, no network runtime.
PURE = (
    "potluck.coordinator.placement",
    "potluck.coordinator.job",
    "potluck.coordinator.allocation",
    "potluck.protocol.membership",
    "potluck.compression.chooser",
    "potluck.peer.train.schedule",
    "potluck.classpar.swarm.plan",
    "potluck.sim",
)
# Importing these must load neither torch nor hivemind: a fast `potluck --help`, configs without torch.
LIGHT = (
    "potluck.cli",
    "potluck.protocol.checkpoints",
    "potluck.protocol.collective",
    "potluck.protocol.envelope",
    "potluck.protocol.identity",
    "potluck.protocol.invite",
    "potluck.protocol.jobspec",
    "potluck.protocol.keys",
    "potluck.protocol.membership",
    "potluck.protocol.records",
    "potluck.protocol.training",
    "potluck.protocol.wire",
    "potluck.net.config",
    "potluck.peer.config",
    "potluck.coordinator.config",
)
MAX_MODULES = 16  # per folder: past it, a folder mixes concerns
MAX_LINES = 600  # per file, in the package, the tests and the scripts alike

TREE = Tree(REPO)


def test_every_module_belongs_to_a_known_part():
    unknown = unknown_parts(TREE, LAYERS)
    assert not unknown, f"modules outside the layer map (add the part to RANK and the docs): {unknown}"


def test_layer_rule():
    bad = layer_violations(TREE, LAYERS)
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_no_import_cycles_counting_type_checking_and_inline_imports():
    cycles = import_cycles(TREE)
    assert not cycles, f"import cycles: {cycles}"


def test_no_imports_inside_functions():
    """Imports sit at the top, so a module's dependencies are its first lines. Exceptions: optional
    dependencies, TYPE_CHECKING blocks, and the command bodies of cli/."""
    bad = inline_imports(TREE, LAYERS, LAZY, OPTIONAL, INLINE_ALLOWED)
    assert not bad, "imports inside functions:\n" + "\n".join(bad)


@pytest.mark.parametrize("prefix", PURE)
def test_pure_modules_import_no_event_loop_or_network(prefix):
    assert any(m == prefix or m.startswith(prefix + ".") for m in TREE.modules), f"{prefix} is gone"
    bad = impure_imports(TREE, LAYERS, prefix)
    assert not bad, f"{prefix} must stay pure (time as `now`, no asyncio, no net):\n" + "\n".join(bad)


def test_no_folder_holds_more_than_16_modules():
    """In the package and the tests. ``scripts/`` is a flat list of entry points, one per benchmark or
    check, each named by the docs that report its figures; they import only the library."""
    bad = [f for root in ("potluck", "tests") for f in crowded_folders(REPO / root, MAX_MODULES)]
    assert not bad, "folders to split by concern:\n" + "\n".join(bad)


def test_no_file_is_longer_than_600_lines():
    bad = long_files([REPO / "potluck", REPO / "tests", REPO / "scripts"], MAX_LINES, REPO)
    assert not bad, "files to split:\n" + "\n".join(bad)


@pytest.mark.slow
def test_light_modules_load_neither_torch_nor_hivemind():
    code = (
        "import sys\n"
        f"for m in {list(LIGHT)!r}: __import__(m)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'hivemind'})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    heavy = out.stdout.strip()
    if heavy:  # say which of them pulls it in
        culprits = []
        for m in LIGHT:
            probe = f"import sys; import {m}; print(any(k in sys.modules for k in ('torch', 'hivemind')))"
            one = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
            if one.stdout.strip() == "True":
                culprits.append(m)
        pytest.fail(f"importing {culprits} loads {heavy}")


# --- each rule catches a planted violation -------------------------------------------------------------


def _plant(tmp: Path, files: dict[str, str]) -> Tree:
    """A scratch ``potluck`` package of ``files`` (path -> source), every folder a package."""
    for rel, text in files.items():
        path = tmp / "potluck" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in [path.parent, *path.parent.parents]:
            if parent == tmp:
                break
            (parent / "__init__.py").touch()
        path.write_text(text)
    return Tree(tmp)


def test_a_planted_upward_import_is_caught(tmp_path):
    tree = _plant(tmp_path, {"protocol/a.py": "from potluck.peer.b import x\n", "peer/b.py": "x = 1\n"})
    assert any("protocol (rank 1) may not import peer" in b for b in layer_violations(tree, LAYERS))


def test_a_planted_import_between_equal_ranks_is_caught(tmp_path):
    tree = _plant(tmp_path, {"peer/a.py": "import potluck.coordinator.b\n", "coordinator/b.py": ""})
    assert any("peer (rank 4) may not import coordinator" in b for b in layer_violations(tree, LAYERS))


def test_a_planted_type_checking_import_across_layers_is_caught(tmp_path):
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from potluck.cli.b import x\n"
    tree = _plant(tmp_path, {"net/a.py": src, "cli/b.py": "x = 1\n"})
    assert any("net (rank 2) may not import cli" in b for b in layer_violations(tree, LAYERS))


def test_a_planted_coordinator_import_of_model_is_caught(tmp_path):
    tree = _plant(tmp_path, {"coordinator/a.py": "from potluck.model import b\n", "model/b.py": ""})
    assert any("coordinator never imports model" in b for b in layer_violations(tree, LAYERS))


def test_a_planted_sub_part_ranks_apart_from_its_parent(tmp_path):
    """``classpar`` (rank 2) may not import the peer; ``classpar.swarm`` (rank 5) may, and the peer may
    not import ``classpar.swarm``."""
    tree = _plant(
        tmp_path,
        {
            "classpar/swarm/a.py": "from potluck.peer import b\n",
            "classpar/c.py": "from potluck.peer import b\n",
            "peer/b.py": "",
            "peer/d.py": "from potluck.classpar.swarm import a\n",
        },
    )
    bad = layer_violations(tree, LAYERS)
    assert any("classpar/c.py" in b for b in bad) and any("peer/d.py" in b for b in bad), bad
    assert not any("classpar/swarm/a.py" in b for b in bad), bad


def test_a_module_outside_the_map_is_caught(tmp_path):
    tree = _plant(tmp_path, {"newpart/a.py": "", "errors.py": ""})
    assert unknown_parts(tree, LAYERS) == ["potluck.newpart", "potluck.newpart.a"]


def test_a_planted_cycle_through_a_type_checking_import_is_caught(tmp_path):
    tree = _plant(
        tmp_path,
        {
            "testbed/lab.py": "from potluck.testbed.check import measure\n",
            "testbed/check.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from potluck.testbed.lab import Lab\n",
        },
    )
    assert import_cycles(tree) == [["potluck.testbed.check", "potluck.testbed.lab"]]


def test_a_planted_cycle_through_an_inline_import_is_caught(tmp_path):
    tree = _plant(
        tmp_path,
        {"cli/a.py": "def f():\n    from potluck.cli import b\n", "cli/b.py": "from potluck.cli import a\n"},
    )
    assert import_cycles(tree) == [["potluck.cli.a", "potluck.cli.b"]]


def test_a_planted_inline_import_is_caught_outside_the_cli_only(tmp_path):
    body = "def f():\n    import json\n    import pyarrow\n"
    tree = _plant(tmp_path, {"peer/a.py": body, "cli/a.py": body})
    assert inline_imports(tree, LAYERS, LAZY, OPTIONAL, INLINE_ALLOWED) == [
        "potluck/peer/a.py:2 imports json"
    ]


def test_a_planted_event_loop_in_pure_policy_is_caught(tmp_path):
    tree = _plant(
        tmp_path, {"coordinator/job/a.py": "import asyncio\n", "coordinator/job/b.py": "import math\n"}
    )
    assert impure_imports(tree, LAYERS, "potluck.coordinator.job") == [
        "potluck/coordinator/job/a.py:1 imports asyncio"
    ]


def test_a_planted_crowded_folder_is_caught(tmp_path):
    _plant(tmp_path, {f"peer/m{i}.py": "" for i in range(MAX_MODULES + 1)} | {"net/a.py": ""})
    assert crowded_folders(tmp_path / "potluck", MAX_MODULES) == [
        f"potluck/peer: {MAX_MODULES + 1} modules (at most {MAX_MODULES})"
    ]


def test_a_planted_long_file_is_caught_in_scripts_too(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bench.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "scripts" / "ok.sh").write_text("true\n" * MAX_LINES)
    assert long_files([tmp_path / "scripts"], MAX_LINES, tmp_path) == [
        f"scripts/bench.py: {MAX_LINES + 1} lines (at most {MAX_LINES})"
    ]


def test_no_module_of_the_package_imports_transformers():
    """transformers makes Hugging Face files in tests only: potluck reads and writes them itself."""
    bad = []
    for path in sorted((REPO / "potluck").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "transformers"]
    assert not bad, bad
