"""The docs name files that exist and outputs where the scripts really write them."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_no_reference_to_a_missing_models_md():
    """examples/compile_onnx.py, examples/ci/lumc-bench.yml and docs/triton-backend.md pointed at
    MODELS.md, which is not in the repository (the README's Models table lists the models)."""
    assert not (ROOT / "MODELS.md").exists()
    assert "## Models" in (ROOT / "README.md").read_text()
    stale = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
             if p.is_file() and p.suffix in {".py", ".md", ".yml", ".toml", ".sh"}
             and "tests" not in p.relative_to(ROOT).parts and ".git" not in p.parts
             and ".venv" not in p.parts and "build" not in p.relative_to(ROOT).parts
             and "MODELS.md" in p.read_text(errors="ignore")]
    assert stale == []


def test_gpu_check_outputs_are_where_the_docs_say():
    """docs/triton-backend.md said the gpu-check table goes to build/gpu-check/gpu-results.md; the
    script writes the main job's table to docs/gpu-results.md and the per-form one to
    $OUT/gpu-forms.md."""
    script = (ROOT / "backends/triton/gpu_check.sh").read_text()
    doc = (ROOT / "docs/triton-backend.md").read_text()
    written = set(re.findall(r"--(?:json|markdown) (\S+)", script))
    assert written == {'"$OUT/gpu-check.json"', '"$OUT/gpu-main.json"', "docs/gpu-results.md",
                       '"$OUT/gpu-forms.md"'}
    out = re.search(r"OUT=\$\{GPU_CHECK_OUT:-(\S+)\}", script).group(1)
    for path in ("docs/gpu-results.md", f"{out}/gpu-main.json", f"{out}/gpu-check.json",
                 f"{out}/gpu-forms.md"):
        assert f"`{path}`" in doc, path
    assert f"{out}/gpu-results.md" not in doc
