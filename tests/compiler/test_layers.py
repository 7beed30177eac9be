"""compiler/ is grouped by stage and its imports point one way: tools -> core -> frontends ->
runtime (a group never imports one above it)."""
import pathlib
import re

RANK = {"runtime": 0, "frontends": 1, "core": 2, "tools": 3}
ROOT = pathlib.Path(__file__).resolve().parents[2] / "compiler"
IMPORT = re.compile(r"^\s*(?:from|import)\s+lumc\.compiler\.(runtime|frontends|core|tools)\b")


def test_compiler_imports_point_one_way():
    bad = []
    for group, rank in RANK.items():
        for path in (ROOT / group).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                m = IMPORT.match(line)
                if m and RANK[m.group(1)] > rank:
                    bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
    assert not [p.name for p in ROOT.glob("*.py") if p.name != "__init__.py"], \
        "modules belong in a stage folder"
