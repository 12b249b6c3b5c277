"""The house's floors: imports run one way (README, *Architecture*).

* ``runtime/``, ``core/`` and ``guard/`` never import ``testing/`` (fault injection is a
  plug-in a launcher names), ``sync/`` (the sync face's offline tools and CLI sit above the
  runtime) or ``supervise/`` (the supervisor drives the runtime, not the other way);
* ``core/`` is pure: it imports the standard library's side-effect-free modules, numpy, scipy,
  other core modules and the ground floor's definitions (``events``, ``protocol``), nothing
  that does I/O, keeps time or needs torch;
* no two modules import each other;
* a runtime started without faults has no injection code in ``sys.modules``.

Every import counts, a lazy one inside a function too: it runs the same way when it runs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "unbroken"

#: what core may import besides unbroken.core.*
CORE_ALLOWED = {"__future__", "dataclasses", "typing", "collections", "collections.abc", "enum",
                "math", "statistics", "functools", "itertools", "re", "random", "bisect",
                "heapq", "numpy", "scipy", "unbroken.events", "unbroken.protocol",
                # a scoped catch_warnings around numpy's all-NaN medians (core.changepoint)
                "warnings"}
LOWER = ("runtime", "core", "guard")
UPPER = ("testing", "sync", "supervise")


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, lazily or not, as absolute names."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            # `from unbroken.core import sync` imports the module unbroken.core.sync
            out.update(f"{name}.{a.name}" for a in node.names
                       if (SRC.parent / Path(*f"{name}.{a.name}".split("."))).exists()
                       or (SRC.parent / Path(*f"{name}.{a.name}".split("."))).with_suffix(
                           ".py").exists())
    return out


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in SRC.rglob("*.py")}


def _room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_lower_floors_never_import_testing_sync_or_supervise():
    bad = sorted(f"{m} -> {d}" for m, deps in _graph().items() if _room(m) in LOWER
                 for d in deps if d.startswith("unbroken.") and _room(d) in UPPER)
    assert bad == []


def test_core_imports_only_pure_modules():
    bad = sorted(f"{m} -> {d}" for m, deps in _graph().items() if _room(m) == "core"
                 for d in deps
                 if not d.startswith("unbroken.core") and d.split(".")[0] not in CORE_ALLOWED
                 and d not in CORE_ALLOWED)
    assert bad == []


def test_no_two_modules_import_each_other():
    g = _graph()

    def own_package(a: str, b: str) -> bool:  # a package's __init__ and its own modules
        return a.startswith(b + ".") or b.startswith(a + ".")

    cycles = sorted(f"{a} <-> {b}" for a, deps in g.items() for b in deps
                    if a < b and a in g.get(b, ()) and not own_package(a, b))
    assert cycles == []


def test_the_checks_see_a_lazy_upward_import(tmp_path):
    # the walker must see imports inside functions: a check that missed them would pass
    # vacuously on exactly the imports the house used to hide
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from unbroken.testing.faults import install\n")
    tree = ast.parse(f.read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "unbroken.testing.faults" in names


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_a_runtime_without_faults_imports_no_injection_code():
    code = ("import sys\n"
            "import unbroken.runtime.stacked_worker, unbroken.runtime.stacked\n"
            "import unbroken.runtime.syncmodes, unbroken.runtime.hooks\n"
            "import unbroken.supervise.supervisor, unbroken.supervise.local\n"
            "print(sorted(m for m in sys.modules if m.startswith(('unbroken.testing', "
            "'unbroken.sync'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
