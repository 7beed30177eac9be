"""DESIGN.md's one-way dependencies, checked on the source: ``ir`` imports no other lumc folder;
``rewrites`` and ``backends`` import ``ir`` only (never each other, never ``compiler``). Every
import counts, a function-level one included."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"ir": {"ir"}, "rewrites": {"ir", "rewrites"}, "backends": {"ir", "backends"}}


def _lumc_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "lumc" and len(parts) > 1:
                yield node.lineno, parts[1]


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_point_one_way(folder):
    bad = [f"{p.relative_to(ROOT)}:{line} imports lumc.{target}"
           for p in sorted((ROOT / folder).rglob("*.py"))
           for line, target in _lumc_imports(p) if target not in ALLOWED[folder]]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_violation(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from lumc.compiler.core import search\n")
    assert list(_lumc_imports(f)) == [(2, "compiler")]
