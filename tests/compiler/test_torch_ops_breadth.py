"""More ATen ops against PyTorch eager: ``erfc``, ``diagonal``, ``unfold``, ``triu_indices`` /
``tril_indices``, ``empty_permuted``, ``copysign``, ``signbit``, ``hypot``, ``searchsorted``,
``bucketize``, ``kthvalue``, ``median``, ``cummax`` / ``cummin``, ``cdist``, ``sgn``, ops with a
``dim`` on 0-d tensors; with NaN, infinities, signed zeros, ties and ragged shapes where the op
defines them."""
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lumc.compiler.core.torch_compile import compile_module as _compile_module

compile_module = functools.partial(_compile_module, search=False)
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

NAN, INF = float("nan"), float("inf")
G = torch.Generator().manual_seed(1)
X = torch.randn(4, 6, generator=G)
X3 = torch.randn(2, 5, 6, generator=G)
# ties (rounded), NaN and infinities in one row
R = torch.tensor([[2.0, 1.0, 2.0, NAN, 1.0, -INF], [0.5, -0.0, 0.0, 3.0, 3.0, -1.0],
                  [INF, 2.0, NAN, NAN, -3.0, 2.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def _close(got, ref, tol, scale=False):
    """Equal NaN positions and signed zeros; elsewhere within ``tol`` relative to each value (or,
    with ``scale``, to the largest: sums of terms that cancel)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, ref.shape, got.dtype)
    if ref.dtype.is_floating_point:
        big = ref[ref.isfinite()].abs().max().item() if scale and ref.isfinite().any() else 0.0
        atol = tol * big if scale else tol * 1e-2
        assert torch.allclose(got, ref, rtol=tol, atol=atol, equal_nan=True), (got, ref)
        # signed zeros as eager has them
        z = ref == 0
        assert torch.equal(torch.signbit(got[z]), torch.signbit(ref[z]))
    else:
        assert torch.equal(got, ref), (got, ref)


CASES = {
    "erfc": (lambda x: torch.erfc(x * 4), X, 3e-7),
    "erfc tail and infinities": (lambda x: torch.erfc(torch.tensor([-INF, -3.0, 0.0, 4.0, 9.0, INF, NAN])
                                                      + x[0, 0] * 0), X, 3e-7),
    "diagonal offsets": (lambda x: torch.cat([torch.diagonal(x, 2), torch.diagonal(x, -1),
                                              torch.diagonal(x, 9)]), X, 0),
    "diagonal of other dims": (lambda x: torch.diagonal(X3 * x[0, 0], -1, 2, 0), X, 1e-6),
    "unfold": (lambda x: x.unfold(1, 3, 2) + x.t().unfold(0, 2, 3).sum(), X, 1e-6),
    "unfold of a slice": (lambda x: x[1:, 1:].unfold(0, 2, 1), X, 0),
    "triu/tril indices": (lambda x: torch.cat([x[tuple(torch.triu_indices(4, 6, 1))],
                                               x[tuple(torch.tril_indices(4, 6, -1))]]), X, 0),
    "empty_like filled": (lambda x: torch.empty_like(x).fill_(2.0) + torch.zeros_like(x), X, 0),
    "copysign": (lambda x: torch.copysign(x, torch.tensor([-0.0, 0.0, -1.0, 2.0, -INF, 1.0])),
                 X, 0),
    "copysign of zeros": (lambda x: torch.copysign(x * 0, -x), X, 0),
    "signbit": (lambda x: torch.signbit(torch.cat([x, torch.tensor([[-0.0, 0.0, INF, -INF, 1, -1]])])),
                X, 0),
    # eager's sign: NaN -> 0 (ONNX Sign keeps NaN), -0.0 -> +0.0, infinities -> +-1
    "sign of NaN, zeros, infinities": (lambda x: torch.sign(torch.cat([x, R])), X, 0),
    "hypot": (lambda x: torch.hypot(x * 1e30, torch.tensor([INF, NAN, 0.0, 1e30, 3.0, -0.0])), X, 2e-7),
    "hypot tiny": (lambda x: torch.hypot(x * 1e-30, x.flip(1) * 1e-30), X, 2e-7),
    "searchsorted": (lambda x: torch.searchsorted(torch.tensor([-1.0, 0.0, 0.0, 1.0]),
                                                  torch.cat([x, R], 0)), X, 0),
    "searchsorted right, batched": (lambda x: torch.searchsorted(x.sort(1)[0], x[:, :3].round(),
                                                                 right=True, out_int32=True), X, 0),
    "bucketize with NaN": (lambda x: torch.bucketize(R, torch.tensor([-1.0, 0.0, 2.0]), right=True),
                           X, 0),
    "kthvalue": (lambda x: torch.stack([torch.kthvalue(x, 3, 0)[0], torch.kthvalue(x, 1, 0)[0]]),
                 X, 0),
    "kthvalue index, keepdim": (lambda x: torch.kthvalue(x, 2, 1, keepdim=True)[1], X, 0),
    "median with NaN": (lambda x: torch.median(R, 1)[0], X, 0),
    "median index of NaN": (lambda x: torch.median(torch.where(x > 0.8, NAN, x), 1)[1], X, 0),
    "median of all": (lambda x: torch.median(x), X, 0),
    "cummax": (lambda x: torch.cummax(R, 1)[0], X, 0),
    "cummax index, ties and NaN": (lambda x: torch.cummax(R, 1)[1], X, 0),
    "cummin": (lambda x: torch.cummin(R, 1)[0], X, 0),
    "cummin index, dim 0": (lambda x: torch.cummin(R, 0)[1], X, 0),
    "cummax int": (lambda x: torch.cummax((x * 3).long(), 1)[0], X, 0),
    "cdist p=2": (lambda x: torch.cdist(x, x.flip(0) * 2), X, 1e-5),
    "cdist p=1, 0, inf, 3": (lambda x: torch.stack([torch.cdist(x, X3[0, :3], p=p)
                                                    for p in (1.0, 0.0, INF, 3.0)]), X, 1e-5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_against_eager(name):
    f, x, tol = CASES[name]
    m = Fn(f).eval()
    with torch.no_grad():
        ref = m(x)
        got = compile_module(m, (x,))(x)
    _close(got, ref, tol)


def test_erfc_keeps_relative_accuracy_in_the_tail():
    """erfc(x) for large x is tiny; 1 - erf(x) would be 0 from x = 4 on in fp32."""
    x = torch.linspace(-5, 10, 3001)
    got = compile_module(Fn(torch.erfc).eval(), (x,))(x).double()
    ref = torch.tensor([math.erfc(v) for v in x.double().tolist()], dtype=torch.float64)
    ok = ref > 1e-37
    assert ((got[ok] - ref[ok]).abs() / ref[ok]).max() < 3e-7


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_2d(mode, padding, align):
    g = torch.Generator().manual_seed(2)
    img = torch.randn(2, 3, 5, 7, generator=g)
    # positions inside, on and well outside [-1, 1]; a few exactly halfway between pixels
    grid = torch.rand(2, 4, 6, 2, generator=g) * 3.2 - 1.6
    grid[0, 0, :3] = torch.tensor([[0.0, 0.0], [1 / 7, -0.6], [-1.0, 1.0]])
    # just outside the border, where PyTorch's bicubic blends taps on both sides
    grid[1, 0, :4] = torch.tensor([[-1.05, -1.1], [1.08, 1.12], [-1.2, 0.3], [0.2, 1.19]])
    m = Fn(lambda x: nn.functional.grid_sample(x, grid, mode=mode, padding_mode=padding,
                                               align_corners=align)).eval()
    with torch.no_grad():
        ref = m(img)
        got = compile_module(m, (img,))(img)
    _close(got, ref, 1e-5, scale=True)


def test_grid_sample_3d():
    g = torch.Generator().manual_seed(3)
    vol = torch.randn(1, 2, 3, 4, 5, generator=g)
    grid = torch.rand(1, 2, 3, 4, 3, generator=g) * 2.4 - 1.2
    m = Fn(lambda x: nn.functional.grid_sample(x, grid, padding_mode="border",
                                               align_corners=True)).eval()
    with torch.no_grad():
        ref = m(vol)
        got = compile_module(m, (vol,))(vol)
    _close(got, ref, 1e-5, scale=True)


@pytest.mark.parametrize("padding", ["border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_onnx_gridsample_cubic_near_the_border_matches_the_onnx_reference(padding, align):
    """ONNX moves only positions outside [-0.5, d - 0.5] (align_corners 0) inside; one just
    inside the edge keeps its own cubic taps, each clamped."""
    import numpy as np
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.frontends.onnx_frontend.importer import import_onnx
    g = np.random.default_rng(4)
    x = g.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = (g.random((1, 3, 8, 2)) * 2.6 - 1.3).astype(np.float32)
    grid[0, 0, :4] = [[-1.05, -1.02], [1.09, 1.1], [-0.95, 1.04], [1.15, -1.2]]
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic", padding_mode=padding,
                            align_corners=align)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
        helper.make_tensor_value_info("g", TensorProto.FLOAT, grid.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    want = ReferenceEvaluator(model).run(None, {"x": x, "g": grid})[0]
    imported = import_onnx(model)
    got = ReferenceExecutor(imported.graph)({"x": x, "g": grid})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name,f,args", [
    ("nearest reflection half-pixel ties", lambda x, g: nn.functional.grid_sample(
        x, g, mode="nearest", padding_mode="reflection", align_corners=False),
     (torch.arange(4.).reshape(1, 1, 1, 4), torch.stack(
         [torch.tensor([1.5, -1.5, 1.25, 3.0, 10.0, 1e4]), torch.zeros(6)], -1).reshape(1, 1, 6, 2))),
    ("index_put bool accumulate", lambda x, i, v: x.index_put((i,), v, accumulate=True),
     (torch.zeros(4, dtype=torch.bool), torch.tensor([1, 1]), torch.tensor([True, True]))),
    ("index_fill int with a float", lambda x, i: x.index_fill(1, i, -2.7),
     (torch.zeros(2, 3, dtype=torch.long), torch.tensor([1]))),
    ("cdist p=0 with NaN", lambda a, b: torch.cdist(a, b, p=0),
     (torch.tensor([[NAN, 1.0], [0.0, 2.0]]), torch.tensor([[0.0, 0.0]]))),
    ("median of nothing", lambda x: torch.median(x), (torch.zeros(0),)),
    ("signbit of bools", lambda x: torch.signbit(x), (torch.tensor([True, False]),)),
    ("searchsorted of a Python scalar", lambda s: torch.searchsorted(s, 0.5),
     (torch.tensor([0.0, 1.0]),)),
])
def test_edge_cases_found_by_a_breaking_helper(name, f, args):
    class M(nn.Module):
        def forward(self, *xs):
            return f(*xs)
    m = M().eval()
    with torch.no_grad():
        ref = m(*args)
        got = compile_module(m, args)(*args)
    _close(got, ref, 1e-6)


def test_kthvalue_along_dim_0_through_the_egraph(tmp_path, monkeypatch):
    """A sort along dim 0 put a horizontal-fusion function term in a shape's e-class; reading the
    e-graph took it for the shape (a TypeError sank the compile)."""
    import lumc
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    v = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    m = Fn(lambda t: torch.kthvalue(t, 2, 0)[0]).eval()
    f = lumc.compile(m, budget="20s", example_inputs=(v,), device="sim:h200")
    assert f.specializations[0].compiled.report_dict()["egraph"]["error"] is None
    _close(torch.as_tensor(f(v)), m(v), 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_sgn_of_a_real_tensor_is_eager_sgn(dtype):
    """``aten.sgn`` had no handler: export decomposes it to ``sign``, but a graph that keeps it
    (``make_fx`` without the table, or ``supported_ops``) was refused as not implemented. Lowered
    here from such a graph and run on the reference executor: NaN gives 0, +-0.0 give +0.0,
    +-inf give +-1, as eager."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from lumc.backends.reference import run_reference
    from lumc.compiler.frontends.torch_frontend import check_supported
    from lumc.compiler.frontends.torch_frontend.lowering import FxLowering
    from lumc.compiler.frontends.torch_frontend.registry import lumc_dtype
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.tensor import Tensor

    x = torch.cat([R.flatten(), X.flatten(), torch.tensor([-0.0, 0.0, INF, -INF, NAN, -2.5])])
    x = x.to(dtype) if dtype.is_floating_point else (x[x.isfinite()] * 3).to(dtype)
    gm = make_fx(lambda t: (torch.sgn(t),), tracing_mode="fake")(x)
    assert any(n.target is torch.ops.aten.sgn.default for n in gm.graph.nodes)
    check_supported(gm.graph)
    (ph,) = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    inp = input_node("x", tuple(x.shape), lumc_dtype(dtype))
    (y,) = FxLowering(gm.graph, {ph: Tensor(inp)}).run()
    got = torch.from_numpy(run_reference(Graph({"x": inp}, {"y": y.node}), {"x": x.numpy()})["y"])
    ref = torch.sgn(x)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)) and not got.isnan().any()
    _close(got, ref, 0)
    assert torch.equal(torch.signbit(got), torch.signbit(ref))


def test_sgn_of_a_complex_tensor_is_refused_in_one_line():
    from torch.fx.experimental.proxy_tensor import make_fx

    from lumc.compiler.frontends.torch_frontend import check_supported
    from lumc.ir.errors import UnsupportedOpError

    gm = make_fx(torch.sgn, tracing_mode="fake")(torch.tensor([1 + 1j, 0j, -2j]))
    with pytest.raises(UnsupportedOpError) as e:
        check_supported(gm.graph)
    msg = str(e.value)
    assert "\n" not in msg and "aten.sgn.default" in msg and "complex64" in msg, msg
    assert "not implemented" not in msg, msg


@pytest.mark.parametrize("dynamic", [False, True])
def test_grouped_query_sdpa_through_torch_compile(dynamic, tmp_path, monkeypatch):
    # torch.compile decomposes F.scaled_dot_product_attention(..., enable_gqa=True) (transformers'
    # Llama/Qwen2 with a KV cache) to _scaled_dot_product_flash_attention_for_cpu, which has no
    # flag: its 2 key/value heads against 4 query heads were a ShapeError "do not broadcast"
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True) * 2

    f = torch.compile(attn, backend="lumc", dynamic=dynamic,
                      options={"budget": "10s", "device": "sim:h200", "max_size": 32})
    for lk in ((6, 9) if dynamic else (6,)):
        q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, lk, 8), torch.randn(2, 2, lk, 8)
        torch.testing.assert_close(f(q, k, v), attn(q, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,f", [
    ("softmax", lambda x, i: F.softmax(x, 0)),
    ("log_softmax", lambda x, i: F.log_softmax(x, -1)),
    ("softmax to f32", lambda x, i: F.softmax(x.half(), 0, dtype=torch.float32)),
    ("flip", lambda x, i: x.flip(0) - x),
    ("gather", lambda x, i: x.gather(-1, i) * 2),
    ("index_select", lambda x, i: x.index_select(0, i)),
    ("var", lambda x, i: torch.stack([x.var(0, correction=0), x.std(0)])),
    ("var_mean keepdim", lambda x, i: torch.var_mean(x, 0, correction=0, keepdim=True)[1]),
    ("normalize", lambda x, i: F.normalize(x, dim=0)),
    ("vector_norm keepdim", lambda x, i: torch.linalg.vector_norm(x, 3.0, 0, keepdim=True)),
])
@pytest.mark.filterwarnings("ignore:std.*degrees of freedom:UserWarning")
def test_dim_ops_read_a_0d_tensor_as_one_element(name, f):
    """PyTorch reads a 0-d tensor as one element along dim 0 / -1 (softmax 1, log_softmax 0, std
    NaN); these were refused ('reduce axis 0 out of range for rank 0', 'cannot lower: IndexError')
    or lowered to shape (1,) for ()."""
    class M(nn.Module):
        def forward(self, x, i):
            return f(x, i)
    x, i = torch.tensor(-2.5), torch.tensor(0)
    m = M().eval()
    ref = m(x, i)
    _close(compile_module(m, (x, i))(x, i), ref, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_mul_and_div_take_a_scalar_at_f32_as_eager(dtype):
    """Eager multiplies and divides a 16-bit tensor by a scalar (a Python number, a 0-d f32
    tensor) at f32 and rounds once; lumc rounded the scalar to the tensor's dtype first:
    ``h * 70000.0`` was inf (70000 overflows f16), ``h / 70000.0`` 0, ``h * 1e-8 * 1e8`` NaN,
    ``h * (1/3)`` an ulp off; so did ``div`` with a rounding mode (``trunc(h / 0.7)`` a whole 1
    off in bf16) and ``leaky_relu``'s slope. ``add``/``sub`` round the scalar first in eager too
    (unchanged)."""
    x = (torch.randn(4, 6, generator=G) * 3).to(dtype)
    big = 70000.0 if dtype == torch.float16 else 3.0e38
    cases = {
        "mul_big": lambda h: h * big,
        "div_big": lambda h: h / big,
        "tiny_then_huge": lambda h: h * 1e-8 * 1e8,
        "third": lambda h: h * (1 / 3),
        "rdiv": lambda h: 0.1 / h,
        "add_third": lambda h: h + 1 / 3,
        "trunc_div": lambda h: torch.div(h, 0.7, rounding_mode="trunc"),
        "floor_div": lambda h: torch.div(h, 1 / 3, rounding_mode="floor"),
        "leaky_relu": lambda h: F.leaky_relu(h, 1 / 3),
    }
    for name, f in cases.items():
        m = Fn(f)
        got, want = compile_module(m, (x,))(x), m(x)
        assert got.dtype == want.dtype, name
        assert torch.equal(got.float().nan_to_num(7.0), want.float().nan_to_num(7.0)), \
            (name, got, want)
    s = torch.tensor(big)                         # a 0-d f32 tensor: the same
    got = compile_module(Fn2(), (x, s))(x, s)
    assert torch.equal(got.float(), (x * s).float())
    # an integer tensor of more dims is cast to the 16-bit dtype first (2049 -> 2048 in f16),
    # then multiplied: not at f32 (6147 * 1 rounds to 6144 in f16, 6148 from f32)
    h = torch.tensor([[1.0, 3.0, -1.0]], dtype=dtype)
    i = torch.tensor([[2049, 2049, 4097]])
    got = compile_module(Fn2(), (h, i))(h, i)
    assert got.dtype == (h * i).dtype and torch.equal(got.float(), (h * i).float()), (got, h * i)


class Fn2(nn.Module):
    def forward(self, h, c):
        return h * c
