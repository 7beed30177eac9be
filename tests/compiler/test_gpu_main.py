"""make gpu-check's main job: without a GPU it prints the plan and stops with exit 2; its table."""
from lumc.compiler.tools import gpu_main


def test_without_gpu_prints_the_plan_and_stops(tmp_path, capsys):
    rc = gpu_main.main(["--json", str(tmp_path / "m.json"), "--markdown", str(tmp_path / "r.md")])
    out = capsys.readouterr()
    assert rc == gpu_main.NO_GPU_EXIT
    assert "STOP: no CUDA device" in out.err and "7. write the table" in out.out
    assert not (tmp_path / "r.md").exists()           # nothing claimed as measured
    assert sum(s for _, s in gpu_main.PLAN) <= 600


def test_jobs_cover_the_six_models_in_both_precisions():
    names = [j["name"] for j in gpu_main.jobs()]
    assert names[:4] == list(gpu_main.MODELS)
    assert {"GPT-2 small seq128 fp32", "GPT-2 small seq128 bf16", "BERT-base seq128 fp32",
            "BERT-base seq128 bf16"} <= set(names)


def test_table_row():
    rows = [{"model": "m", "lumc_s": 20e-6, "eager_s": 60e-6, "inductor_s": None, "pct_copy": 41.0,
             "pct_matmul": 3.25, "check": "ok", "max_rel_error": 1e-6,
             "impls": {"triton": 9, "cublas": 2}},
            {"model": "n", "error": "model not carried"}]
    t = gpu_main.format_table(rows, "NVIDIA H200", {"bandwidth": 4.1e12, "bf16": 7.5e14})
    assert "| m | 20.0 us | 60.0 us | - | 41% | 3.2% | ok (1.0e-06) | cublas 2, triton 9 |" in t
    assert "| n | - | - | - | - | - | model not carried | - |" in t
    assert "4100 GB/s" in t and "750 TFLOP/s" in t
