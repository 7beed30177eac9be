"""Kernels as the e-graph hands them over: a form constructor decoded to primitives
(``rewrites.language.decode_form``) and cut over placeholders (``compiler.kernel_builder``), rendered
and run against the reference. Catches drift between the two sides of the meaning contract."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.ir.graph import input_node
from lumc.ir.kernels import Kernel
from lumc.ir.tensor import Tensor
from lumc.backends.triton import configs
from triton_cases import check

LOOP = configs.make(4, 2, BLOCK_M=1, BLOCK_K=256)


def _call(name, args, form):
    from lumc.compiler.core.kernel_builder import build_call
    from lumc.rewrites.language import decode_form
    return build_call([decode_form(name, args)], lambda n: False, form=form).kernel


def _pushed(name, args):
    """The form cut with its views pushed down onto the placeholders (what the cutter did for
    every kernel before named forms kept their composition): the probabilities then reach the
    value product as elementwise math over its [.., Lq, Lk, Dv] domain, not through a view."""
    from lumc.compiler.core.kernel_builder import build_call
    from lumc.rewrites.language import decode_form
    return Kernel("attention", build_call([decode_form(name, args)], lambda n: False).kernel.meaning)


def _attention_args(ctor, d):
    q = input_node("q", (2, 37, 16), d)
    k = input_node("k", (2, 45, 16), d)
    v = input_node("v", (2, 45, 24), d)
    args = [q, Tensor(k).transpose(-1, -2).node, v, Tensor.const(np.array(0.25, d.np)).node]
    if ctor == "AttentionMasked":
        args.append(input_node("m", (2, 37, 45), d))
    if ctor == "AttentionSelect":
        args += [input_node("keep", (37, 45), dt.bool_), Tensor.const(np.array(-np.inf, d.np)).node]
    return args


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("ctor", ["Attention", "AttentionMasked", "AttentionSelect"])
def test_attention_forms(ctor, d):
    tk = check(_call(ctor, _attention_args(ctor, d), "attention"),
               config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))
    assert tk.rendered.variant == "flash"


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("ctor", ["AttentionMasked", "AttentionSelect"])
def test_attention_with_views_pushed_through_the_probabilities(ctor, d):
    kern = _pushed(ctor, _attention_args(ctor, d))
    left = next(n for n in kern.meaning.nodes() if n.op == "SumReduce" and len(n.shape) == 4
                and n.shape[-1] == 24).srcs[0].srcs[0]
    while left.op == "Cast":
        left = left.srcs[0]
    assert left.op == "Mul"        # E2 * G2 over [2, 37, 45, 24], no view in between
    tk = check(kern, config=configs.make(4, 1, BLOCK_M=16, BLOCK_N=16))
    # the pushed copy of exp2((x - max) c) is the same expression: one exp2 per tile plus alpha
    # (each of the two fp32 dots is a PRECISION branch: bf16, fp16 or tl.dot's own precision)
    assert tk.source.count("tl.dot(") == 2 * (3 if d == dt.f32 else 1) and tk.source.count("tl.exp2(") == 2


@pytest.mark.parametrize("d", [dt.f32, dt.f16, dt.f64], ids=str)
@pytest.mark.parametrize("ctor,form,args", [("Softmax", "softmax", [-1]),
                                            ("LayerNorm", "layernorm", [-1, 1e-5]),
                                            ("RMSNorm", "rmsnorm", [-1, 1e-5])])
def test_norm_forms_one_pass_and_looped(ctor, form, args, d):
    x = input_node("x", (7, 1023), d)
    kern = _call(ctor, [x, *args], form)
    check(kern)
    tk = check(kern, variant="looped", config=LOOP)
    if form != "rmsnorm":   # the online merge recognizes the decoded composition too
        assert ("online softmax" if form == "softmax" else "Chan/Welford") in tk.source


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
def test_decoded_norm_forms_normalize_each_row(d):
    """``decode_form("LayerNorm", [x, -1, eps])`` reduced over every dim (``range(-1, rank)``),
    and an f16 form's means would now widen (``Tensor.mean``): the form is per row over the last
    dim, in ``x``'s dtype, against numpy in float64."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.ir.graph import Graph
    from lumc.rewrites.language import decode_form
    x = input_node("x", (5, 33), d)
    v = np.random.default_rng(0).standard_normal((5, 33)).astype(d.np) * 3 + 1
    for name, axis in (("LayerNorm", -1), ("LayerNorm", 1), ("RMSNorm", -1)):
        out = decode_form(name, [x, axis, 1e-5])
        assert {n.dtype for n in Graph({"x": x}, {"y": out}).nodes()} == {d}    # no widening
        got = ReferenceExecutor(Graph({"x": x}, {"y": out}), "float64")({"x": v})["y"]
        w = v.astype(np.float64)
        if name == "LayerNorm":
            w = w - w.mean(-1, keepdims=True)
        want = w / np.sqrt((w * w).mean(-1, keepdims=True) + 1e-5)
        tol = 1e-5 if d == dt.f32 else 1e-2        # f16 arithmetic: a few ulps of 1
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=tol, err_msg=name)
