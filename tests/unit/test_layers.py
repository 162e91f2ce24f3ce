"""Guardrails on the tree: the layer rule, no import cycles, no hidden imports, light entry points.

The rules are those of docs/development.md ("Rules the tests enforce"). Every module of ``potluck`` is
parsed (not imported), so a violation anywhere fails here with the file, the line and the rule.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "potluck"

# Rank of each top-level part: a module imports only from parts of a lower rank, or from its own part.
# Parts of equal rank never import each other (peer and coordinator meet only in protocol).
RANK = {
    "root": 0,  # potluck/*.py: errors, aio, logs, compat, __init__
    "protocol": 1,
    "compression": 1,
    "net": 2,
    "model": 2,
    "classpar": 2,  # class-parallel sub-networks and erasure codes: torch, numpy, scipy and root helpers only
    "telemetry": 2,
    "transfer": 3,  # stage state over the swarm: used by peers and the coordinator alike
    "peer": 4,
    "coordinator": 4,
    "testbed": 5,
    "sim": 5,
    "cli": 6,
}
# Imports that are not the rank rule's business: a part may never import these whatever their rank.
FORBIDDEN = {"sim": {"net", "peer"}}
# Optional dependencies may be imported where they are used, so a missing extra fails only that path.
OPTIONAL = {"triton", "pyarrow", "tokenizers", "matplotlib", "potluck.compression.kernels.triton_kernels"}
# Listed exceptions to "no imports inside functions", each with its reason. Keep this short.
INLINE_ALLOWED = {
    # dynamo's config is needed only when the codec path is compiled (>= 1M elements); importing it at
    # the top would load the compiler stack for every user of the codecs.
    ("potluck.compression.kernels.cpu", "torch._dynamo.config"),
}
# Modules that are pure policy: time comes in as `now`, no event loop, no network runtime.
PURE = (
    "potluck.coordinator.placement",
    "potluck.coordinator.job",
    "potluck.coordinator.allocation",
    "potluck.protocol.membership",
    "potluck.compression.chooser",
    "potluck.peer.train.schedule",
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
    "potluck.protocol.jobfile",
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


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported potluck module (or third-party name), dotted
    line: int
    in_function: bool
    type_checking: bool


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(importer: str, node: ast.ImportFrom) -> list[str]:
    """Dotted targets of a `from X import a, b`: X.a when that is a module, else X."""
    base = node.module or ""
    if node.level:
        is_pkg = MODULES[importer].name == "__init__.py"
        anchor = importer.split(".")[: len(importer.split(".")) - node.level + (1 if is_pkg else 0)]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            tc = type_checking or (isinstance(child, ast.If) and _is_type_checking(child))
            if isinstance(child, ast.Import):
                out.extend(
                    Import(module, a.name, child.lineno, in_function, type_checking) for a in child.names
                )
            elif isinstance(child, ast.ImportFrom):
                targets = _resolve(module, child)
                out.extend(Import(module, t, child.lineno, in_function, type_checking) for t in targets)
            visit(child, fn, tc)

    visit(tree, False, False)
    return out


ALL_IMPORTS = [imp for module in MODULES for imp in _imports(module)]


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] not in RANK):
        return "root"
    return parts[1]


def _where(imp: Import) -> str:
    return f"{MODULES[imp.module].relative_to(PACKAGE.parent)}:{imp.line} imports {imp.target}"


def test_every_module_belongs_to_a_known_part():
    unknown = sorted({m for m in MODULES if _part(m) not in RANK})
    assert not unknown, f"modules outside the layer map (add the part to RANK and the docs): {unknown}"


def test_layer_rule():
    bad = []
    for imp in ALL_IMPORTS:
        if not imp.target.startswith("potluck") or imp.type_checking:
            continue
        src, dst = _part(imp.module), _part(imp.target)
        if imp.module == "potluck.__main__" and dst == "cli":
            continue  # `python -m potluck` is an entry point, like the console script
        if dst in FORBIDDEN.get(src, ()):
            bad.append(f"{_where(imp)}: {src} never imports {dst}")
        elif src != dst and RANK[dst] >= RANK[src]:
            bad.append(f"{_where(imp)}: {src} (rank {RANK[src]}) may not import {dst} (rank {RANK[dst]})")
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in ALL_IMPORTS:
        if imp.target in MODULES and not imp.in_function and not imp.type_checking:
            graph[imp.module].add(imp.target)
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_imports_inside_functions():
    """Imports sit at the top, so a module's dependencies are its first lines. Exceptions: optional
    dependencies, TYPE_CHECKING blocks, and the command bodies of cli/ (heavy imports wait for the
    command, so --help is fast)."""
    bad = [
        _where(imp)
        for imp in ALL_IMPORTS
        if imp.in_function
        and not imp.type_checking
        and _part(imp.module) != "cli"
        and imp.target.split(".")[0] not in OPTIONAL
        and imp.target not in OPTIONAL
        and (imp.module, imp.target) not in INLINE_ALLOWED
    ]
    assert not bad, "imports inside functions:\n" + "\n".join(bad)


@pytest.mark.parametrize("prefix", PURE)
def test_pure_modules_import_no_event_loop_or_network(prefix):
    bad = [
        _where(imp)
        for imp in ALL_IMPORTS
        if (imp.module == prefix or imp.module.startswith(prefix + "."))
        and (imp.target.split(".")[0] == "asyncio" or _part(imp.target) == "net")
    ]
    assert not bad, f"{prefix} must stay pure (time as `now`, no asyncio, no net):\n" + "\n".join(bad)


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
