"""Size-generic Triton kernels: one module per kernel of a range bucket, its sizes runtime
arguments, checked in the Triton interpreter at several sizes against the reference executor on
the kernel's meaning re-sized there, and compiled ahead of time for Hopper."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.size_generic import SizedKernel, render_sized, rewrite_sizes
from lumc.ir.symbolic import Resizer, probing, resize_int

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))
from test_ranges import encoder  # noqa: E402

P = 61


def test_rewrite_touches_only_probe_products():
    src = ("rm_mask = rm < 61\n    x = tl.load(p + rm * 23424 + 7)\n    s = 0.01639344262295082\n"
           "    q = lumc_matmul_61ab(in61_ptr, 384, 1.5)\n    f = 122.0")
    out = rewrite_sizes(src, {P: "L0"})
    assert "rm < (L0)" in out and "rm * (384*L0) + 7" in out       # 23424 = 384 * 61
    assert "(1.0 / (L0))" in out and "((2*L0) * 1.0)" in out
    assert "lumc_matmul_61ab(in61_ptr, 384, 1.5)" in out
    assert rewrite_sizes("a = 61 * 61", {P: "L0"}) == "a = (L0) * (L0)"
    assert rewrite_sizes("n = 3721", {P: "L0"}) == "n = (L0*L0)"


def test_rewrite_takes_affine_factors_apart_as_resize_does():
    """A literal the kernel derives from padded sizes (twice a padded row, 1220 = 2 (H + 2) at
    H = 32 x 19) is not in the table; the table's factors take it apart, as ``resize_int``
    does for the graph, so the module and the re-sized meaning agree at every size."""
    from lumc.ir.symbolic import Substitution
    table = {610: (2, ((19, 16, 1),))}                  # H + 2 = 2 (16 P + 1)
    out = rewrite_sizes("a = 610\n    b = 1220\n    c = 1220 * 19", {19: "L0"}, table)
    assert "a = (2*(16*L0+1))" in out and "b = (4*(16*L0+1))" in out
    assert "c = (4*(16*L0+1)) * (L0)" in out
    b = out.split("b = ")[1].split("\n")[0]
    for n in (2, 7):
        assert eval(b.replace("L0", str(n))) == resize_int(1220, Substitution({19: n}, table))


@pytest.fixture(scope="module")
def probe_programs():
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.core.pipeline import stage_frontend
    from lumc.rewrites.schedule import Limits
    with probing([P]):
        g = stage_frontend(encoder(), {"L": P}, None).graph
        cands = egraph_candidates(g, "h200", k=2, limits=Limits(seconds=5.0)).candidates
    return [greedy_program(g), *cands]


def test_one_module_serves_every_size(probe_programs):
    forms = set()
    for prog in probe_programs:
        for c in prog.calls:
            k = c.kernel
            sk = SizedKernel(k, {P: "L0"})
            assert sk.rendered.size_args == ("L0",)
            forms.add(k.form)
            for n in (1, 6, 33, 64):
                m = Resizer({P: n}).graph(k.meaning)
                rng = np.random.default_rng(n)
                feed = {name: rng.standard_normal(ph.shape).astype(ph.dtype.np)
                        for name, ph in m.inputs.items()}
                ref = ReferenceExecutor(m, "float64")(feed)
                got = sk(*[feed[name] for name in m.inputs], sizes={"L0": n})
                for o, t in zip(m.outputs, got):
                    r = np.asarray(ref[o], np.float64)
                    assert t.shape == r.shape
                    scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
                    np.testing.assert_allclose(t.numpy(), r, rtol=1e-4, atol=1e-5 * scale,
                                               err_msg=f"{k.form} at L={n}")
            # the module does not depend on the size: rendering again gives the same name
            assert render_sized(k, {P: "L0"}).name == sk.rendered.name
    assert {"matmul", "pointwise"} <= forms


def test_sized_kernels_compile_for_hopper(probe_programs):
    from lumc.backends.triton import configs
    from lumc.backends.triton.aot import compile_many
    mm = next(c.kernel for c in probe_programs[0].calls if c.kernel.form == "matmul")
    rk = render_sized(mm, {P: "L0"})
    cfg = configs.default_config(rk.config_space, rk.problem)
    (res,) = compile_many([(rk, cfg)])
    assert res.error is None and res.spill_stores == 0
    assert res.tensor_core, "a size-generic matmul still runs on tensor cores"


def test_range_artifact_runs_its_size_generic_kernels(tmp_path, monkeypatch):
    """``run --backend triton`` of a range artifact: Triton kernels as the bucket's size-generic
    modules, a vendor kernel of the plan (cuBLAS here) through torch at the call's sizes, as
    ``GpuPlan`` runs it (it ran as Triton at its run config); outputs checked by ``--check``."""
    import lumc
    from lumc.compiler.runtime import extern
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.compiler.tools.cli import cli
    f = lumc.compile(encoder(), budget="60s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "db.sqlite"), shapes={"L": (1, 48)})
    path = tmp_path / "enc.lumc"
    f.save(path)
    vendor = {n: sum((cfg or {}).get("IMPL", "triton") != "triton" for cfg in
                     f.select({"x": np.zeros((1, n, 16), np.float32)}).configs) for n in (2, 29)}
    assert any(vendor.values()), "the plan has no vendor kernel: this test checks nothing"
    ran = []
    call = extern.ExternKernel.__call__

    def counted(self, *a, **k):
        ran.append(tuple(a[0].shape))
        return call(self, *a, **k)
    monkeypatch.setattr(extern.ExternKernel, "__call__", counted)
    for n in (2, 29):
        ran.clear()
        res = CliRunner().invoke(cli, ["run", str(path), "--shape", f"L={n}", "--random",
                                       "--check", "--backend", "triton"])
        assert res.exit_code == 0, res.output
        assert "size-generic module per kernel" in res.output
        assert len(ran) == vendor[n] and all(n in s for s in ran), (n, ran)


def test_padded_convolutions_serve_every_size_through_the_table():
    """A padded CNN's kernels (their sizes H + 2, (H + 2) (W + 2) ... affine values of the
    range's table): one module each, right at every size."""
    from lumc.compiler.core import buckets as B
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.core.pipeline import stage_frontend
    from test_ranges import _cnn
    ranges = {"H": B.DimRange(32, 256, 32), "W": B.DimRange(32, 256, 32)}
    probe, _, fe_p, table = B.probe_sizes(_cnn(), lambda m, s: stage_frontend(m, s, None), {},
                                           ranges)
    assert table
    names = {probe["H"]: "L0", probe["W"]: "L1"}
    padded = 0
    for c in greedy_program(fe_p.graph).calls:
        k = c.kernel
        # indexed in int32 where the bucket's largest sizes allow (the probe sizes are above
        # the range, 32 x 1000+ per dim: rendered there alone, every address would be int64)
        sk = SizedKernel(k, names, table, largest={probe["H"]: 3, probe["W"]: 2})
        assert "tl.int64" not in sk.rendered.source, k.form
        if k.form == "matmul" and not padded:
            wide = SizedKernel(k, names, table)
            assert "tl.int64" in wide.rendered.source
            got = wide(*[np.ones(ph.shape, ph.dtype.np) for ph in
                         Resizer({probe["H"]: 1, probe["W"]: 1}, table).graph(k.meaning)
                         .inputs.values()], sizes={"L0": 1, "L1": 1})
            assert all(np.isfinite(t.numpy()).all() for t in got)
        padded += any(v in table for n in k.meaning.nodes() for v in n.shape)
        for h, w in ((1, 2), (3, 1)):
            m = Resizer({probe["H"]: h, probe["W"]: w}, table).graph(k.meaning)
            rng = np.random.default_rng(h * 10 + w)
            feed = {name: rng.standard_normal(ph.shape).astype(ph.dtype.np)
                    for name, ph in m.inputs.items()}
            ref = ReferenceExecutor(m, "float64")(feed)
            got = sk(*[feed[name] for name in m.inputs], sizes={"L0": h, "L1": w})
            for o, t in zip(m.outputs, got):
                r = np.asarray(ref[o], np.float64)
                assert t.shape == r.shape
                np.testing.assert_allclose(t.numpy(), r, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{k.form} at {h}x{w}")
    assert padded, "some kernel reads a padded size"


def test_a_key_limit_that_moves_with_the_size_is_not_baked_in(tmp_path, monkeypatch):
    """Causal plus a global key every 19 positions: at the probe S = 113 the last global key is 95,
    at S = 116 it is 114; a size-generic kernel rendered at the probe must not stop at 95."""
    from onnx import TensorProto as TP, helper, numpy_helper

    import lumc
    from lumc.backends.triton import configs as C
    from lumc.backends.triton.size_generic import SizedKernel

    def c(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v), name))
    nodes = [c("z", np.int64(0)), c("one", np.int64(1)), c("ax", np.int64(2)),
             c("ax1", np.array([1], np.int64)), c("m19", np.int64(19)), c("scale", np.float32(0.25)),
             c("ninf", np.float32(-np.inf)),
             helper.make_node("Shape", ["q"], ["sh"]), helper.make_node("Gather", ["sh", "ax"], ["n"]),
             helper.make_node("Range", ["z", "n", "one"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax1"], ["rc"]),
             helper.make_node("LessOrEqual", ["r", "rc"], ["causal"]),
             helper.make_node("Mod", ["r", "m19"], ["jm"]), helper.make_node("Equal", ["jm", "z"], ["glob"]),
             helper.make_node("Or", ["causal", "glob"], ["mask"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
             helper.make_node("Where", ["mask", "s1", "ninf"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    io = lambda n: helper.make_tensor_value_info(n, TP.FLOAT, [1, 2, "S", 16])  # noqa: E731
    m = helper.make_model(helper.make_graph(nodes, "g", [io("q"), io("k"), io("v")], [io("y")]),
                          opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    f = lumc.compile(m.SerializeToString(), budget="40s", device="sim:h200", workers="local:1",
                     shapes={"S": (2, 120)})
    key, cm = f._ranged[-1]
    call = next(c for c in cm.program.calls if c.kernel.form == "attention")
    sk = SizedKernel(call.kernel, {v: "L0" for v in key.probes.values()}, key.table, None)
    for S in (113, 116, 120):
        rng = np.random.default_rng(S)
        feed = {n: rng.standard_normal((1, 2, S, 16)).astype(np.float32) for n in "qkv"}
        i = np.arange(S)
        s = feed["q"].astype(np.float64) @ feed["k"].astype(np.float64).transpose(0, 1, 3, 2) * 0.25
        s = np.where((i[None] <= i[:, None]) | (i[None] % 19 == 0), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p / p.sum(-1, keepdims=True)) @ feed["v"]
        out = sk(*[feed[n.arg.name] for n in call.inputs], sizes={"L0": S},
                 config=C.make(4, 1, BLOCK_M=16, BLOCK_N=16))[0].numpy().reshape(ref.shape)
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max(), S


def _one_node_model(op: str, x_shape: list, y_shape: list, inits: list):
    from onnx import TensorProto, helper
    f = TensorProto.FLOAT
    g = helper.make_graph([helper.make_node(op, ["x", inits[0].name], ["y"])], op,
                          [helper.make_tensor_value_info("x", f, x_shape)],
                          [helper.make_tensor_value_info("y", f, y_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("case", ["reduce", "matmul"])
def test_a_bucket_kernel_takes_the_variant_its_config_was_chosen_for(case, tmp_path):
    """A bucket's plan is searched at the bucket's largest size, but its size-generic modules are
    rendered at the probe sizes: a variant picked there (a split reduction for rows past 65536,
    a split-K matmul where few output tiles leave SMs idle) named other knobs than the config
    the search chose (``SPLIT``, ``SPLIT_K``), and ``run --backend triton`` (as ``GpuPlan``)
    failed with a TypeError in the small buckets. Each bucket runs, values checked."""
    from onnx import numpy_helper
    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.compiler.tools.cli import cli
    rng = np.random.default_rng(0)
    if case == "reduce":      # probes past SPLIT_MIN_K, 3 rows: split at the probes
        m = _one_node_model("ReduceSum", [3, "L"], [3, 1],
                            [numpy_helper.from_array(np.array([-1], np.int64), "ax")])
        top, sizes, shape = 70000, (7, 100, 1000), lambda n: (3, n)
    else:                     # probes with enough tiles: no split-K there, split in 92..861
        w = (rng.standard_normal((512, 64)) * 0.05).astype(np.float32)
        m = _one_node_model("MatMul", ["L", 512], ["L", 64], [numpy_helper.from_array(w, "W")])
        top, sizes, shape = 8192, (50, 100, 861), lambda n: (n, 512)
    f = lumc.compile(m, budget="60s", device="sim:h200", shapes={"L": (1, top)},
                     db=TuningDatabase(tmp_path / "db.sqlite"))
    path = tmp_path / "m.lumc"
    f.save(path)
    for n in sizes:
        np.save(tmp_path / "x.npy", rng.standard_normal(shape(n)).astype(np.float32))
        res = CliRunner().invoke(cli, ["run", str(path), "--input", f"x={tmp_path / 'x.npy'}",
                                       "--check", "--backend", "triton"])
        assert res.exit_code == 0 and res.exception is None, (n, res.output, res.exception)
        assert "size-generic module per kernel" in res.output
