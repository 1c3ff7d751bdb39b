"""The import rules of the package tree, read from the source (AST), lazy imports included.

Each package's ``__init__`` docstring says what it may import; this test holds the tree to it.
The layers, from the bottom up: ``common`` imports nothing from ``agent``, ``coordinator``,
``experiment`` or ``cli``, and its sub-packages stack up (model -> schedulers -> learning ->
sim); ``agent`` imports only ``common`` (``agent.serving`` and ``agent.cluster`` never import
``agent.learning``: serving runs without the trainers; ``agent.learning`` imports ``common``
only); ``coordinator`` (the hub) imports only ``common``; ``experiment`` (the local
multi-cluster experiment) imports ``common``, ``agent`` and ``coordinator``; ``cli`` (the
``fedsched`` command) may import every package, and nothing imports it.

A reference counts however it is written: an ``import`` statement, a module named by string
(``importlib.import_module("fedsched.x")``, ``__import__``, a ``"fedsched.x.y:attr"`` entry of a
lazy registry, ``python -m fedsched.x`` in a subprocess), a package-data read
(``importlib.resources.files("fedsched.x")``) or, in a module that uses ``__file__``, a path
into another top-level package folder (``"agent/..."``).

``bench/`` may import any fedsched package but never ``tests`` (the shared harness is
``bench.harness``, which tests import).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGES = ("common", "agent", "coordinator", "experiment", "cli")

# importer (module or package prefix) -> fedsched packages it may import (prefixes); a module
# may always import its own rule's prefix.
ALLOWED: dict[str, tuple[str, ...]] = {
    "common": (),  # the package itself and any module not named below
    "common.files": (),
    "common.compute": (),
    "common.dataclass_flags": (),
    "common.security": ("common.files",),
    "common.model": (),
    "common.schedulers": ("common.model",),
    "common.learning": ("common.model", "common.schedulers", "common.files"),
    "common.sim": ("common.model", "common.schedulers", "common.learning", "common.compute", "common.files"),
    "common.sim.replay.config": ("common.model",),
    # replay's parts compose: workload, usage and churn read config only, never the simulator
    # that owns them (nor one another); the simulator uses them all
    "common.sim.replay.workload": ("common.model", "common.sim.replay.config"),
    "common.sim.replay.usage": ("common.model", "common.sim.replay.config"),
    "common.sim.replay.churn": ("common.model", "common.sim.replay.config"),
    # a deployed member's recording replays at the load it offered (members.recorded_load)
    "common.federation": ("common.model", "common.learning", "common.files", "common.sim.replay"),
    "common.proto": (),
    "agent": (),
    "agent.cluster": ("common",),
    "agent.serving": ("common", "agent.cluster"),
    "agent.learning": ("common",),
    "agent.federation": ("common", "agent.learning"),
    "coordinator": ("common",),
    "experiment": ("common", "agent", "coordinator"),
    "cli": ("common", "agent", "coordinator", "experiment"),
}
# Reasoned exceptions: (importer module, imported module) -> why.
EXCEPTIONS = {
    ("common.schedulers", "common.learning.scorers"):
        "make_scheduler resolves 'learned' and *.pt names to a policy; imported lazily inside the "
        "resolver so baselines never load torch",
    ("common.schedulers", "common.sim.portfolio"):
        "make_scheduler resolves 'best-of[...]' names, whose choice runs packing simulations; "
        "imported lazily inside the resolver (the simulator itself imports the schedulers)",
}

_PKG = "|".join(PACKAGES)
#: A fedsched module named in a string: "fedsched.agent.learning.ppo" or "fedsched.cli.main:main".
STRING_REF = re.compile(rf"fedsched\.((?:{_PKG})(?:\.\w+)*)(?::[\w.]+)?")
#: The start of an f-string naming one: f"fedsched.agent.learning.{name}".
FSTRING_REF = re.compile(rf"fedsched\.((?:{_PKG})(?:\.\w+)*)(?:\.|$)")
#: A path into a top-level package folder: "agent", "agent/policies/default.pt".
PATH_REF = re.compile(rf"({_PKG})(?:/.*)?")
#: ``tests`` named as a module: "tests", "tests.extender_support", "tests.x:attr".
TESTS_REF = re.compile(r"tests(?:\.\w+)*(?::[\w.]+)?")


def _module(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose: a module path there is not a reference)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _references(path: Path) -> list[tuple[int, str, str]]:
    """Every fedsched module or package this file refers to: (line, target without the
    ``fedsched.`` prefix, how). Import statements, module names in strings, package-data reads
    and paths into package folders (in a module that uses ``__file__``)."""
    source = path.read_text()
    tree = ast.parse(source)
    docs = _docstrings(tree)
    uses_file = "__file__" in source
    fstring_parts: set[int] = set()
    out: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import (use fedsched.* paths)")
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.JoinedStr):
            fstring_parts.update(id(v) for v in node.values)
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                m = FSTRING_REF.match(head.value)
                if m:
                    out.append((node.lineno, m.group(1), "f-string module name"))
            continue
        else:
            continue
        for n in names:
            if n == "fedsched" or n.startswith("fedsched."):
                out.append((node.lineno, n.removeprefix("fedsched."), "import"))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in docs or id(node) in fstring_parts:
            continue
        m = STRING_REF.fullmatch(node.value)
        if m:
            out.append((node.lineno, m.group(1), "module named by string"))
        m = PATH_REF.fullmatch(node.value) if uses_file else None
        if m:
            out.append((node.lineno, m.group(1), "path into a package folder"))
    return sorted(out)


def _rule(module: str) -> tuple[str, tuple[str, ...]]:
    best = max((k for k in ALLOWED if module == k or module.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{module}: no import rule covers this module (add it to ALLOWED)"
    return best, ALLOWED[best]


def _within(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _excused(module: str, target: str) -> bool:
    return any(_within(module, (imp,)) and _within(target, (dep,)) for imp, dep in EXCEPTIONS)


def _violations(path: Path, module: str) -> list[str]:
    """The references of ``path`` (as module ``module``) that its rule does not allow. A module
    may always name its own top-level package itself (``resources.files("fedsched.common")`` in
    ``common.model``: that package's ``__init__`` holds only its docstring, beside its data)."""
    key, allowed = _rule(module)
    own_top = module.split(".")[0]
    out = []
    for line, target, how in _references(path):
        if target == own_top or _within(target, (key, *allowed)) or _excused(module, target):
            continue
        out.append(f"{path}:{line}: {module} refers to fedsched.{target} ({how}), "
                   f"but {key} may import only {', '.join(allowed) or 'no other fedsched package'}")
    return out


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (REPO / pkg).is_dir()
                  for p in (REPO / pkg).rglob("*.py") if "_pb2" not in p.name)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_package_rules(path: Path) -> None:
    bad = _violations(path, _module(path))
    if bad:
        pytest.fail("\n".join(bad))


def test_every_package_says_what_it_may_import() -> None:
    inits = sorted(p for pkg in PACKAGES if (REPO / pkg).is_dir() for p in (REPO / pkg).rglob("__init__.py"))
    for init in inits:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 60 and "placeholder" not in doc, f"{init}: needs a docstring saying what it holds"
        assert "import" in doc.lower(), f"{init}: the docstring should say what the package may import"


def test_every_installed_package_is_ruled() -> None:
    """Each top-level folder pyproject.toml installs is one of PACKAGES, so none escapes the rules."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tops = {name.removeprefix("fedsched.").split(".")[0] for name in setuptools["packages"]}
    assert tops <= set(PACKAGES), f"no rules for {sorted(tops - set(PACKAGES))}: add them to ALLOWED"
    for name, folder in setuptools["package-dir"].items():
        assert name == f"fedsched.{folder}", (name, folder)


# ---- the rules themselves catch what they should ------------------------------------------------

def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from fedsched.agent.learning.ppo import PPOTrainer\n")
    (line, target, _), = _references(bad)
    assert line == 2 and not _within(target, ALLOWED["agent.serving"])
    assert _violations(bad, "agent.serving.planted")


PLANTED_IN_COMMON = {
    "import_module": 'import importlib\n\n\ndef f():\n'
                     '    return importlib.import_module("fedsched.agent.learning.ppo")\n',
    "from importlib": 'from importlib import import_module\n\n'
                      'M = import_module("fedsched.agent.learning.ppo")\n',
    "__import__": 'def f():\n    return __import__("fedsched.agent.learning.ppo")\n',
    "registry": 'REGISTRY = {"ppo": "fedsched.agent.learning.ppo:PPOTrainer"}\n',
    "f-string": 'import importlib\n\n\ndef f(name):\n'
                '    return importlib.import_module(f"fedsched.agent.{name}")\n',
    "subprocess": 'import subprocess, sys\n\nsubprocess.run([sys.executable, "-m", "fedsched.cli.main"])\n',
    "resources.files": 'from importlib import resources\n\n'
                       'P = resources.files("fedsched.agent").joinpath("policies", "default.pt")\n',
    "importlib.resources.files": 'import importlib.resources\n\n'
                                 'P = importlib.resources.files("fedsched.coordinator")\n',
    "files": 'from importlib.resources import files\n\nP = files("fedsched.experiment")\n',
    "path": 'from pathlib import Path\n\nP = Path(__file__).parents[2] / "agent/policies/default.pt"\n',
}


@pytest.mark.parametrize("kind", PLANTED_IN_COMMON)
def test_the_rules_catch_a_planted_reference_in_common(tmp_path: Path, kind: str) -> None:
    """A string import, a registry entry or a package-data read across the layers fails like an
    import statement does."""
    bad = tmp_path / "planted.py"
    bad.write_text(PLANTED_IN_COMMON[kind])
    assert _violations(bad, "common.sim.planted"), kind


def test_the_rules_let_the_allowed_references_through(tmp_path: Path) -> None:
    ok = tmp_path / "ok.py"
    ok.write_text('"""Mentions fedsched.agent.learning.ppo in prose only."""\n'
                  "import importlib\n"
                  "import logging\n"
                  "from importlib import resources\n\n"
                  'LOG = logging.getLogger("fedsched.serve")  # a logger name, not a module\n'
                  'DATA = resources.files("fedsched.common").joinpath("data", "policies")\n'
                  'M = importlib.import_module("fedsched.common.model.cluster")\n')
    assert _violations(ok, "common.sim.ok") == []
    assert [t for _, t, _ in _references(ok)] == ["common", "common.model.cluster"]


# ---- bench/ ---------------------------------------------------------------------------------

def _tests_references(path: Path) -> list[tuple[int, str]]:
    """``tests`` imported: by statement, by ``import_module``/``__import__``/``find_spec`` of a
    string, or as a ``"tests.x:attr"`` registry entry."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            by_name = func in ("import_module", "__import__", "find_spec")
            names = [node.args[0].value] if by_name and isinstance(node.args[0].value, str) else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
            names = [node.value] if TESTS_REF.fullmatch(node.value) else []
        else:
            continue
        out.extend((node.lineno, n) for n in names if n == "tests" or n.startswith(("tests.", "tests:")))
    return sorted(out)


def test_bench_never_imports_tests() -> None:
    """Benchmarks may import any fedsched package, but not the test suite: what both need is in
    ``bench/harness`` (tests import that)."""
    bad = [f"{p.relative_to(REPO)}:{line}: imports {name}"
           for p in sorted((REPO / "bench").rglob("*.py")) for line, name in _tests_references(p)]
    assert not bad, "bench/ imports tests:\n" + "\n".join(bad)


def test_the_bench_rule_catches_a_planted_import(tmp_path: Path) -> None:
    bad = tmp_path / "b.py"
    bad.write_text('import importlib\n\nfrom tests.extender_support import serve_process\n'
                   'H = importlib.import_module("tests.paths")\nR = {"x": "tests.builders:make_pods"}\n'
                   'OUT = "tests.json"  # a file name, not an import\n')
    assert [n for _, n in _tests_references(bad)] == [
        "tests.extender_support", "tests.paths", "tests.builders:make_pods"]
