"""The import rules of the package tree, read from the source (AST), lazy imports included.

Each package's ``__init__`` docstring says what it may import; this test holds the tree to it:
``common`` imports nothing from ``agent`` or ``coordinator``, and its sub-packages stack up
(model -> schedulers -> learning -> sim); ``agent.serving`` and ``agent.cluster`` never import
``agent.learning`` (serving runs without the trainers); ``agent`` never imports ``coordinator``;
``coordinator`` imports ``agent`` only in ``federate`` (the local main job runs members).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGES = ("common", "agent", "coordinator")

# importer (module or package prefix) -> fedsched packages it may import (prefixes)
ALLOWED: dict[str, tuple[str, ...]] = {
    "common": (),  # the package itself and any module not named below
    "agent": (),
    "common.files": (),
    "common.compute": (),
    "common.security": ("common.files",),
    "common.model": (),
    "common.schedulers": ("common.model",),
    "common.learning": ("common.model", "common.schedulers", "common.files"),
    "common.sim": ("common.model", "common.schedulers", "common.learning", "common.compute"),
    "common.federation": ("common.model", "common.learning", "common.files"),
    "common.proto": (),
    "common.cli": ("common",),
    "agent.cluster": ("common",),
    "agent.serving": ("common", "agent.cluster"),
    "agent.learning": ("common", "agent.serving.decision_log"),
    "agent.federation": ("common", "agent.learning", "agent.serving"),
    "coordinator.federate": ("common", "coordinator", "agent.federation", "agent.learning"),
    "coordinator": ("common", "coordinator"),
}
# Reasoned exceptions: (importer module, imported module) -> why.
EXCEPTIONS = {
    ("common.schedulers", "common.learning.scorers"):
        "make_scheduler resolves 'learned' and *.pt names to a policy; imported lazily inside the "
        "resolver so baselines never load torch",
}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import (use fedsched.* paths)")
        for n in names[:1]:
            if n == "fedsched" or n.startswith("fedsched."):
                out.append((node.lineno, n.removeprefix("fedsched.")))
    return out


def _rule(module: str) -> tuple[str, tuple[str, ...]]:
    best = max((k for k in ALLOWED if module == k or module.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{module}: no import rule covers this module (add it to ALLOWED)"
    return best, ALLOWED[best]


def _within(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "_pb2" not in p.name)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_package_rules(path: Path) -> None:
    module = _module(path)
    key, allowed = _rule(module)
    for line, target in _imports(path):
        if _within(target, (key,)) or _within(target, allowed):
            continue
        if any(_within(module, (imp,)) and _within(target, (dep,)) for imp, dep in EXCEPTIONS):
            continue
        pytest.fail(f"{path.relative_to(REPO)}:{line}: {module} imports fedsched.{target}, "
                    f"but {key} may import only {', '.join(allowed) or 'no other fedsched package'}")


def test_every_package_says_what_it_may_import() -> None:
    for init in sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 60 and "placeholder" not in doc, f"{init}: needs a docstring saying what it holds"
        assert "import" in doc.lower(), f"{init}: the docstring should say what the package may import"


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from fedsched.agent.learning.ppo import PPOTrainer\n")
    (line, target), = _imports(bad)
    assert line == 2 and not _within(target, ALLOWED["agent.serving"])
