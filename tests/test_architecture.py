"""The arrows between packages (docs/architecture.md): reports → analyzer ← rules, cli on top.

Read from the import statements of every module (top-level and inside functions), so a new
arrow fails here before it becomes a habit. Forbidden:
- any import circle between fxlens modules (top-level imports);
- cli → rules (the CLI goes through the API and pipeline);
- rules → analyzer internals: rules see only `fxlens.analyzer.core` and the rooms' `types`;
- reports → analyzer beyond the report types (`core`, and the review room's diff and gates);
- analyzer → rules, reports, cli, api or pipeline (the engine knows no op, view or command).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fxlens"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "fxlens" or name.startswith("fxlens.")}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def arrows(top_level_only: bool) -> list[tuple[str, str]]:
    return [(source, target) for source, path in sorted(MODULES.items())
            for target in sorted(imports(path, top_level_only)) if target in MODULES]


def test_no_import_circle() -> None:
    graph = nx.DiGraph(arrows(top_level_only=True))
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], f"import circles: {cycles[:3]}"


def allowed(source: str, target: str) -> bool:
    if source.startswith("fxlens.cli"):
        return not target.startswith("fxlens.rules")
    if source.startswith("fxlens.rules"):
        return (not target.startswith("fxlens.analyzer")
                or target.startswith("fxlens.analyzer.core")
                or target.endswith(".types"))
    if source.startswith("fxlens.reports"):
        return (not target.startswith("fxlens.analyzer")
                or target.startswith(("fxlens.analyzer.core", "fxlens.analyzer.review.diff",
                                      "fxlens.analyzer.review.gates")))
    if source.startswith("fxlens.analyzer"):
        return not target.startswith(("fxlens.rules", "fxlens.reports", "fxlens.cli",
                                      "fxlens.api", "fxlens.pipeline"))
    return True


@pytest.mark.parametrize("source, target", [
    ("fxlens.cli.main", "fxlens.rules.fusion"),
    ("fxlens.rules.fusion", "fxlens.analyzer.fusion.kernels"),
    ("fxlens.reports.dot", "fxlens.analyzer.memory.training_state"),
    ("fxlens.analyzer.cost.engine", "fxlens.rules"),
])
def test_the_rule_refuses_known_bad_arrows(source: str, target: str) -> None:
    assert not allowed(source, target)


def test_no_forbidden_arrow() -> None:
    bad = sorted(f"{s} → {t}" for s, t in arrows(top_level_only=False) if not allowed(s, t))
    assert bad == [], "forbidden imports:\n" + "\n".join(bad)
