"""The folders show the architecture: imports between them run one way (docs/architecture.md)."""

import ast
from collections import defaultdict

from conftest import ROOT

PACKAGE = ROOT / "rlft"


def unit(module: str) -> str:
    """rlft.rollout.collect -> 'rollout/'; rlft.trainer -> 'trainer'."""
    parts = module.split(".")
    if len(parts) < 2:
        return "rlft"
    return parts[1] + ("/" if (PACKAGE / parts[1]).is_dir() else "")


def import_graph() -> dict[str, set[str]]:
    """Which folder or top-level module imports which (lazy imports inside functions included)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        me = unit(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            edges[me] |= {unit(name) for name in names if name.startswith("rlft.")} - {me}
    return edges


def test_no_two_folders_import_each_other():
    edges = import_graph()
    assert edges["trainer"] >= {"learner/", "rollout/", "algos/"}  # the graph is read at all
    two_way = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))
    assert two_way == []


def test_rollout_and_learner_meet_only_in_shared_modules():
    edges = import_graph()
    assert "learner/" not in edges["rollout/"] and "rollout/" not in edges["learner/"]
    assert "rollout/" not in edges["config/"]  # the config never imports an engine
    assert "models/" in edges["rollout/"] and "models/" in edges["learner/"]  # MoE routing: one module
