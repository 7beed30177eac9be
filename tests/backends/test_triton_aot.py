"""Ahead-of-time compile of every kernel form for cuda:90 (Hopper), without a GPU.

Each form, at GPU-filling sizes, compiles at its default config and at the legal config with the
largest tiles (the most shared memory); the test fails on a config that does not compile or whose
compiled shared memory passes the 227 KiB a block may use. The shared memory of every compile is
printed (``pytest -s``) and written to ``aot-shared-memory.json`` in the test's tmp dir.

The compiles use the GPU machine's Triton (3.6, which ``make install`` puts beside the one here;
``test_triton_gpu_image.py``) where it is installed, since that is the compiler the kernels meet.
"""
from __future__ import annotations

import json

from lumc.backends.triton import configs, render
from lumc.backends.triton.aot import compile_many
from test_triton_gpu_image import GPU_IMAGE_TRITON, gpu_image_triton
from triton_cases import every_form_kernels


def _largest(rk) -> configs.Config:
    space = configs.config_space(rk.config_space, rk.problem)
    def size(c):
        kw = c.kwargs()
        tiles = 1
        for _, v in c.blocks:
            tiles *= v
        return (configs.shared_memory_estimate(rk.config_space, rk.problem, kw), tiles,
                kw["num_warps"])
    return max(space, key=size)


def test_every_form_compiles_for_sm90_and_fits(tmp_path):
    kernels = every_form_kernels()
    jobs, names = [], []
    for name, k, variant in kernels:
        rk = render(k, variant)
        default = configs.default_config(rk.config_space, rk.problem)
        big = _largest(rk)
        for cfg in dict.fromkeys([default, big]) if big != default else [default, big]:
            jobs.append((rk, cfg))
            names.append(name)
    gpu = gpu_image_triton(required=False)     # the GPU machine's Triton, where installed
    results = compile_many(jobs, triton_dir=str(gpu) if gpu else None)
    if gpu:
        assert {r.triton_version for r in results} == {GPU_IMAGE_TRITON}
    rows = []
    for name, r in zip(names, results):
        rows.append({"case": name, "form": r.form, "config": str(r.config),
                     "shared_bytes": r.shared_bytes, "compile_s": round(r.seconds, 2),
                     "error": r.error})
        print(f"{name:18s} {str(r.config):60s} shared {r.shared_bytes} B  {r.seconds:.1f}s"
              + (f"  ERROR {r.error}" if r.error else ""))
    (tmp_path / "aot-shared-memory.json").write_text(json.dumps(rows, indent=1))
    for n, r in zip(names, results):
        if n.endswith("int64"):
            assert "int64" in next(rk for rk, _ in jobs if rk.name == r.kernel).source
    bad = [(n, str(r.config), r.error or f"{r.shared_bytes} B > {configs.SMEM_LIMIT} B")
           for n, r in zip(names, results) if not r.fits]
    assert not bad, bad
    assert len({n for n in names}) >= 13
    per_case = {}
    for n in names:
        per_case[n] = per_case.get(n, 0) + 1
    assert all(v >= 2 for v in per_case.values()), per_case
    # the tensor-core forms really use shared memory (pipelined tiles)
    mm = [r.shared_bytes for n, r in zip(names, results) if n == "matmul"]
    assert max(mm) > 64 * 1024
