"""Ahead-of-time compile of every kernel form for cuda:90 (Hopper), without a GPU.

Each form, at GPU-filling sizes, compiles at its default config and at the legal config with the
largest tiles (the most shared memory); the test fails on a config that does not compile or whose
compiled shared memory passes the 227 KiB a block may use. The shared memory of every compile is
printed (``pytest -s``) and written to ``aot-shared-memory.json`` in the test's tmp dir.
"""
from __future__ import annotations

import json

from lumc.ir import dtypes as dt
from lumc.backends.triton import configs, render
from lumc.backends.triton.aot import compile_many
from lumc.backends.triton.benchcases import bench_cases
from lumc.ir.library.norm import softmax
from triton_cases import layernorm_kernel, make_kernel, softmax_kernel


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
    kernels = [(c.name, c.kernel, None) for c in bench_cases(dt.bf16)]
    kernels += [("matmul-f16", bench_cases(dt.f16)[6].kernel, None),
                ("matmul-f32", bench_cases(dt.f32)[6].kernel, None),
                ("softmax-looped", softmax_kernel((1024, 65536), dt.bf16), "looped"),
                ("layernorm-looped", layernorm_kernel((1024, 65536), dt.bf16), "looped"),
                # indices past 2**31: int64 index arithmetic must compile too
                ("pointwise-int64", make_kernel("pointwise", lambda a: a.sigmoid(),
                                                [((2 ** 31 + 8,), dt.bf16)]), None),
                ("reduction-int64", make_kernel("reduction", lambda a: a.max(0),
                                                [((2 ** 20 + 1, 2049), dt.bf16)]), None),
                ("matmul-int64", make_kernel("matmul", lambda a, b: a @ b,
                                             [((65537, 32768), dt.bf16), ((32768, 64), dt.bf16)]),
                 None),
                # BERT's select mask: two bool paddings combined in the loop, fill -inf
                ("attention-select", make_kernel(
                    "attention", lambda q, k, v, qm, km: softmax(qm.logical_and(km).where(
                        (q @ k.transpose(-1, -2)) * 0.125, float("-inf")), -1).cast(q.dtype) @ v,
                    [((8, 16, 512, 64), dt.bf16)] * 3 + [((1, 1, 512, 1), dt.bool_),
                                                         ((8, 1, 1, 512), dt.bool_)]), None),
                # fp32 (split TF32) at BERT-base's shape with its padding mask: the key loop's
                # pipelined K/V and mask tiles (the 128x64, 2-stage tile took 232 KiB)
                ("attention-f32", make_kernel(
                    "attention", lambda q, k, v, km: softmax(km.where(
                        (q @ k.transpose(-1, -2)) * 0.125, float("-inf")), -1) @ v,
                    [((1, 12, 128, 64), dt.f32)] * 3 + [((1, 1, 1, 128), dt.bool_)]), None),
                # a gated MLP's gate and up in one kernel: two b tiles, two accumulators
                ("matmul-paired", make_kernel(
                    "matmul", lambda x, wg, wu: (x @ wg).maximum(0.0) * (x @ wu),
                    [((1024, 1024), dt.bf16), ((1024, 2816), dt.bf16), ((1024, 2816), dt.bf16)],
                    [("paired", True)]), None),
                # BERT-base's feed-forward block in fp32 (split TF32): the F_TILES loop's live
                # column-tile accumulators
                ("mlp-f32", make_kernel(
                    "mlp", lambda x, w1, w2: (x @ w1).maximum(0.0) @ w2,
                    [((128, 768), dt.f32), ((768, 3072), dt.f32), ((3072, 768), dt.f32)]), None)]
    jobs, names = [], []
    for name, k, variant in kernels:
        rk = render(k, variant)
        default = configs.default_config(rk.config_space, rk.problem)
        big = _largest(rk)
        for cfg in dict.fromkeys([default, big]) if big != default else [default, big]:
            jobs.append((rk, cfg))
            names.append(name)
    results = compile_many(jobs)
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
