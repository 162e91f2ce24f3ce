"""The tree's rules as functions of a source root (docs/architecture.md, "Rules the tests enforce").

Every module is parsed, never imported, so a violation anywhere is reported with its file, line and rule.
``tests/unit/test_layers.py`` runs these on the real tree and on planted violations in a scratch tree,
so each rule is shown to catch what it is for.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module (a potluck module when it is one, else the name as written)
    line: int
    in_function: bool
    type_checking: bool


@dataclass(frozen=True)
class Layers:
    """A map of parts and their ranks. A part is a top-level package (``peer``) or a deeper one named
    with dots (``classpar.swarm``); a module belongs to the longest part that prefixes it, and the root
    modules (``potluck/*.py``) to ``root``. A module imports only parts of a lower rank, or its own."""

    rank: Mapping[str, int]
    # Imports that are not the rank rule's business: a part may never import these whatever the ranks.
    forbidden: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Entry points that may import anything (``python -m potluck`` runs the CLI).
    entry_points: frozenset[str] = frozenset()

    def part(self, tree: Tree, module: str) -> str | None:
        """The part ``module`` belongs to; None when the map does not name it."""
        rel = module.split(".")[1:]
        if not rel:
            return "root"
        for n in range(len(rel), 0, -1):
            if ".".join(rel[:n]) in self.rank:
                return ".".join(rel[:n])
        path = tree.modules.get(module)
        if path is not None and path.parent == tree.root / tree.package and path.name != "__init__.py":
            return "root"
        return None


class Tree:
    """Every module under ``root/<package>`` with its imports."""

    def __init__(self, root: Path, package: str = "potluck") -> None:
        self.root, self.package = root, package
        base = root / package
        self.modules: dict[str, Path] = {self._name(p): p for p in sorted(base.rglob("*.py"))}
        self.imports: list[Import] = [imp for m in self.modules for imp in self._imports(m)]

    def _name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def where(self, imp: Import) -> str:
        return f"{self.modules[imp.module].relative_to(self.root)}:{imp.line} imports {imp.target}"

    def _resolve(self, importer: str, node: ast.ImportFrom) -> list[str]:
        """Dotted targets of a ``from X import a, b``: X.a when that is a module, else X."""
        base = node.module or ""
        if node.level:
            is_pkg = self.modules[importer].name == "__init__.py"
            parts = importer.split(".")
            anchor = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
            base = ".".join(anchor + ([base] if base else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in self.modules else base for a in node.names]

    def _imports(self, module: str) -> list[Import]:
        tree = ast.parse(self.modules[module].read_text(), filename=str(self.modules[module]))
        out: list[Import] = []

        def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
            for child in ast.iter_child_nodes(node):
                fn = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                tc = type_checking or (isinstance(child, ast.If) and _is_type_checking(child))
                if isinstance(child, ast.Import):
                    out.extend(Import(module, a.name, child.lineno, fn, tc) for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    out.extend(Import(module, t, child.lineno, fn, tc) for t in self._resolve(module, child))
                visit(child, fn, tc)

        visit(tree, False, False)
        return out

    def internal(self) -> Iterable[Import]:
        return (imp for imp in self.imports if imp.target.split(".")[0] == self.package)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def unknown_parts(tree: Tree, layers: Layers) -> list[str]:
    return sorted(m for m in tree.modules if layers.part(tree, m) is None)


def layer_violations(tree: Tree, layers: Layers) -> list[str]:
    """Imports up or across the ranks, and forbidden imports. ``TYPE_CHECKING`` imports count: a type
    from a higher layer couples the code just the same."""
    bad = []
    for imp in tree.internal():
        src, dst = layers.part(tree, imp.module), layers.part(tree, imp.target)
        if src is None or dst is None or imp.module in layers.entry_points:
            continue
        if dst in layers.forbidden.get(src, frozenset()):
            bad.append(f"{tree.where(imp)}: {src} never imports {dst}")
        elif src != dst and layers.rank[dst] >= layers.rank[src]:
            bad.append(
                f"{tree.where(imp)}: {src} (rank {layers.rank[src]}) may not import {dst} "
                f"(rank {layers.rank[dst]})"
            )
    return bad


def import_cycles(tree: Tree) -> list[list[str]]:
    """Strongly connected components of more than one module, over every import between modules:
    at module level, inside functions and under ``TYPE_CHECKING`` alike (Tarjan)."""
    graph: dict[str, set[str]] = {m: set() for m in tree.modules}
    for imp in tree.internal():
        if imp.target in tree.modules and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
    return cycles


def inline_imports(
    tree: Tree,
    layers: Layers,
    lazy_parts: frozenset[str],
    optional: frozenset[str],
    allowed: frozenset[tuple[str, str]],
) -> list[str]:
    """Imports inside function bodies, except in ``lazy_parts``, of optional dependencies, and the
    listed ``(module, target)`` exceptions."""
    return [
        tree.where(imp)
        for imp in tree.imports
        if imp.in_function
        and not imp.type_checking
        and layers.part(tree, imp.module) not in lazy_parts
        and imp.target.split(".")[0] not in optional
        and imp.target not in optional
        and (imp.module, imp.target) not in allowed
    ]


def impure_imports(tree: Tree, layers: Layers, prefix: str) -> list[str]:
    """Modules under ``prefix`` that import asyncio or the network runtime: pure policy takes ``now``."""
    return [
        tree.where(imp)
        for imp in tree.imports
        if (imp.module == prefix or imp.module.startswith(prefix + "."))
        and (imp.target.split(".")[0] == "asyncio" or layers.part(tree, imp.target) == "net")
    ]


def crowded_folders(root: Path, limit: int) -> list[str]:
    """Python folders under ``root`` holding more than ``limit`` modules (``__init__`` not counted)."""
    out = []
    for folder in sorted({p.parent for p in root.rglob("*.py")}):
        if "__pycache__" in folder.parts:
            continue
        n = sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
        if n > limit:
            out.append(f"{folder.relative_to(root.parent)}: {n} modules (at most {limit})")
    return out


def long_files(roots: Iterable[Path], limit: int, base: Path) -> list[str]:
    """Python and shell files under ``roots`` longer than ``limit`` lines."""
    out = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".py", ".sh") or "__pycache__" in path.parts or not path.is_file():
                continue
            n = len(path.read_text(errors="replace").splitlines())
            if n > limit:
                out.append(f"{path.relative_to(base)}: {n} lines (at most {limit})")
    return out
