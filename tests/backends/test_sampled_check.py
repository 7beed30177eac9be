"""The interpreter check of a large kernel on a sample of its programs (``triton/sampled.py``).

A ResNet-50 at 224x224 on ``sim:h200`` spent its whole 120 s budget in interpreter checks of
convolutions with hundreds of programs each and returned no program. The sampled run must say
exactly which elements its programs wrote, include the grid's corners (the ragged tiles), and a
wrong value in a sampled tile must still reject the kernel.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from lumc.backends.triton import TritonKernel
from lumc.backends.triton import configs as tc
from lumc.backends.triton import sampled
from lumc.backends.triton.sampled import SAMPLE, SAMPLE_ABOVE, pick_programs, run_sampled

from triton_cases import dt, matmul_kernel, random_inputs


def test_pick_programs_takes_every_corner_once_in_loop_order():
    for grid in [(50, 3, 1), (7, 11, 2), (100, 1, 1), (1, 1, 90)]:
        got = pick_programs(grid, 32, seed=7)
        gx, gy, gz = grid
        corners = {(x, y, z) for x in (0, gx - 1) for y in (0, gy - 1) for z in (0, gz - 1)}
        assert corners <= set(got)
        assert len(got) == len(set(got)) == min(32, gx * gy * gz)
        assert all(0 <= x < gx and 0 <= y < gy and 0 <= z < gz for x, y, z in got)
        lin = [(x * gy + y) * gz + z for x, y, z in got]
        assert lin == sorted(lin)
        assert got == pick_programs(grid, 32, seed=7)       # seeded: both runs take the same


def _matmul(m=300, k=16, n=96):
    kern = matmul_kernel(m, k, n, dt.f32)
    ins = random_inputs(kern, seed=3)
    a, b = ins["in0"], ins["in1"]
    cfg = tc.make(4, 2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8, PRECISION="ieee")
    return kern, [a, b], a.astype(np.float64) @ b.astype(np.float64), cfg


def test_a_large_grid_runs_a_sample_and_says_which_elements_it_wrote():
    kern, ins, ref, cfg = _matmul()           # 19 x 6 = 114 programs of 16 x 16
    outs, written, note = run_sampled(TritonKernel(kern), ins, cfg)
    assert note == f"on {SAMPLE} of 114 programs"
    w = written[0]
    tiles = [w[i:i + 16, j:j + 16] for i in range(0, 300, 16) for j in range(0, 96, 16)]
    assert all(t.all() or not t.any() for t in tiles)       # each tile whole or not at all
    assert sum(t.all() for t in tiles) == SAMPLE
    assert w[:16, :16].all() and w[288:, 80:].all()      # the first tile and the ragged last one
    assert not w.all()
    np.testing.assert_allclose(outs[0][w], ref[w], rtol=1e-5, atol=1e-5)


def test_a_small_grid_runs_whole():
    kern, ins, ref, cfg = _matmul(m=64, n=64)     # 16 programs <= SAMPLE_ABOVE
    assert 16 <= SAMPLE_ABOVE
    outs, written, note = run_sampled(TritonKernel(kern), ins, cfg)
    assert written is None and note == ""
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-5)


def _mlp_model(path, b=96, m=8, k=16, n=8):
    """A batched MatMul: the interpreter's big tiles still leave one program per batch."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((b, k, n)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, m, n])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w


def _compile(path, tmp_path, **kw):
    from lumc.compiler.core.pipeline import compile_model
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    return compile_model(str(path), budget="60s", device="sim:h200",
                         db=TuningDatabase(tmp_path / "db.sqlite"), **kw)


def test_a_compile_reports_the_kernels_checked_on_a_sample(tmp_path):
    path = tmp_path / "mm.onnx"
    w = _mlp_model(path)
    cm = _compile(path, tmp_path)
    r = cm.report_dict()
    rows = [row for row in r["per_kernel"] if row.get("checked_on")]
    assert rows and rows[0]["checked_on"].startswith(f"on {SAMPLE} of ")
    assert "checked on a sample of their programs" in cm.report()
    # a second compile judges by the stored verdict (the tuning database) and still says so
    again = _compile(path, tmp_path, reuse_plan=False).report_dict()
    assert again["measured"] == 0 and again["db_hits"] > 0
    assert [row.get("checked_on") for row in again["per_kernel"]] == \
        [row.get("checked_on") for row in r["per_kernel"]]
    x = np.random.default_rng(1).standard_normal((96, 8, 16)).astype(np.float32)
    y = np.asarray(cm(x))
    ref = x.astype(np.float64) @ numpy_helper.to_array(w).astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_a_wrong_value_in_a_sampled_tile_rejects_the_kernel(tmp_path, monkeypatch):
    path = tmp_path / "mm.onnx"
    _mlp_model(path)
    real = sampled.run_sampled

    def corrupt(tk, ins, config):
        outs, written, note = real(tk, ins, config)
        if written is not None:
            i = np.flatnonzero(written[0])[-1]          # an element of the last sampled tile
            outs[0].reshape(-1)[i] += 1.0 + abs(outs[0].reshape(-1)[i])
        return outs, written, note

    monkeypatch.setattr(sampled, "run_sampled", corrupt)
    r = _compile(path, tmp_path).report_dict()
    assert r["candidates_rejected"] >= 1
    assert not any(row.get("checked_on") for row in r["per_kernel"])


@pytest.mark.parametrize("out", ["bool", "int32", "float16"])
def test_bool_integer_and_half_outputs_find_what_the_sample_wrote(out):
    """A bool output has no sentinel value: its sample runs twice (over False and over True); an
    integer output's sentinel is the repeated byte 0xA5, a half's a NaN with a payload."""
    from triton_cases import make_kernel
    n = 70 * 16384 + 5                             # 71 programs of the interpreter's 16384
    if out == "bool":
        kern = make_kernel("pointwise", lambda a: a.gt(a.scalar_like(0.0)), [((n,), dt.f32)])
    else:
        kern = make_kernel("pointwise", lambda a: a.cast(getattr(dt, out[0] + out[-2:])),
                           [((n,), dt.f32)])
    x = (np.random.default_rng(0).standard_normal(n) * 100).astype(np.float32)
    ref = x > 0 if out == "bool" else x.astype(out)
    tk = TritonKernel(kern)
    outs, written, note = run_sampled(tk, [x], tk.check_config())
    assert note == f"on {SAMPLE} of 71 programs"
    w = written[0]
    assert w[:16384].all() and w[-5:].all() and w.sum() == (SAMPLE - 1) * 16384 + 5
    np.testing.assert_array_equal(outs[0][w], ref[w])


def test_check_config_sizes_large_problems_for_the_sample_and_leaves_small_ones():
    from math import ceil
    small = {"M": 64, "N": 64, "K": 32, "batch": 1, "itemsize": 4}
    assert tc.check_config("matmul", small) == tc.interpreter_config("matmul", small)
    conv = {"M": 112 * 112, "N": 64, "K": 147, "batch": 1, "itemsize": 4}  # a 224x224 stem
    big = tc.interpreter_config("matmul", conv).kwargs()
    c = tc.check_config("matmul", conv).kwargs()
    programs = ceil(conv["M"] / c["BLOCK_M"]) * ceil(conv["N"] / c["BLOCK_N"])
    assert programs >= tc.CHECK_PROGRAMS > SAMPLE_ABOVE
    assert ceil(conv["M"] / big["BLOCK_M"]) * ceil(conv["N"] / big["BLOCK_N"]) <= SAMPLE_ABOVE
    assert SAMPLE * c["BLOCK_M"] * c["BLOCK_N"] * conv["K"] <= tc.CHECK_SAMPLE_MACS or \
        c["BLOCK_M"] == c["BLOCK_N"] == 32
    fc = {"M": 1, "N": 4096, "K": 9216, "batch": 1, "itemsize": 4}       # a classifier, M = 1
    c = tc.check_config("matmul", fc).kwargs()
    assert ceil(4096 / c["BLOCK_N"]) >= tc.CHECK_PROGRAMS
    rows = {"M": 93312, "K": 864, "one_pass": True, "BLOCK_K_FIXED": 1024}
    c = tc.check_config("row", rows).kwargs()
    assert ceil(93312 / c["BLOCK_M"]) >= tc.CHECK_PROGRAMS
    assert SAMPLE * c["BLOCK_M"] * 864 <= tc.CHECK_SAMPLE_MACS
    splitk = dict(conv, K=1 << 16)       # two launches: run whole, its tiles unchanged
    assert tc.check_config("matmul_splitk", splitk) == \
        tc.interpreter_config("matmul_splitk", splitk)


class _ShortKernel:
    """A TritonKernel stand-in launching ``sampled_kernels.double_short`` on 100 programs."""
    interpret = True

    def __init__(self, n):
        from types import SimpleNamespace
        self.n = n
        self.rendered = SimpleNamespace(name="double_short",
                                        outputs=[SimpleNamespace(shape=(n,), dtype=dt.f32)])

    def __call__(self, x, outputs=None, config=None):
        import torch
        from sampled_kernels import double_short
        xt = torch.from_numpy(x)
        out = outputs[0] if outputs is not None else torch.full((self.n,), 7.0)
        double_short[(triton_cdiv(self.n, 64),)](xt, out, self.n, BLOCK=64)
        return [out]


def triton_cdiv(a, b):
    return -(-a // b)


def test_an_edge_written_short_is_judged_by_the_whole_run():
    """Its sample leaves the output's last element unwritten: the whole grid runs instead (and a
    check then sees the element the kernel never wrote), and the interpreter is left as it was."""
    n = 100 * 64 - 3
    x = np.arange(n, dtype=np.float32)
    outs, written, note = run_sampled(_ShortKernel(n), [x], None)
    assert written is None and note == ""
    np.testing.assert_array_equal(outs[0][:-1], 2 * x[:-1])
    assert outs[0][-1] != 2 * x[-1]
    kern, ins, ref, cfg = _matmul()
    run_sampled(TritonKernel(kern), ins, cfg)
    got = TritonKernel(kern)(*ins, config=cfg)[0].numpy()      # a plain launch after: every tile
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
