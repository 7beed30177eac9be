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


def test_range_artifact_runs_its_size_generic_kernels(tmp_path):
    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.compiler.tools.cli import cli
    f = lumc.compile(encoder(), budget="60s", device="sim:h200",
                     db=TuningDatabase(tmp_path / "db.sqlite"), shapes={"L": (1, 48)})
    path = tmp_path / "enc.lumc"
    f.save(path)
    for n in (2, 29):
        res = CliRunner().invoke(cli, ["run", str(path), "--shape", f"L={n}", "--random",
                                       "--check", "--backend", "triton"])
        assert res.exit_code == 0, res.output
        assert "size-generic module per kernel" in res.output


def test_padded_convolutions_serve_every_size_through_the_table():
    """A padded CNN's kernels (their sizes H + 2, (H + 2) (W + 2) ... affine values of the
    range's table): one module each, right at every size."""
    from lumc.compiler.core import buckets as B
    from lumc.compiler.core.fusion import greedy_program
    from lumc.compiler.core.pipeline import stage_frontend
    from test_ranges import _cnn
    ranges = {"H": B.DimRange(32, 256, 32), "W": B.DimRange(32, 256, 32)}
    probe, _, fe_p, table = B._probe_sizes(_cnn(), lambda m, s: stage_frontend(m, s, None), {},
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
