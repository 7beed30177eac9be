"""Vision ops of the PyTorch frontend against eager: memory formats, pooling and upsampling edge
cases (the lowered graph on the reference executor, as ``test_torch_frontend``)."""
from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lumc.compiler.core.torch_compile import compile_module as _compile_module
from lumc.ir.errors import UnsupportedOpError

compile_module = functools.partial(_compile_module, search=False)
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


# ---- memory formats ------------------------------------------------------------------------------
class SqueezeExcite(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc(self.pool(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_global_pool_of_a_channels_last_input(dtype):
    """adaptive_avg_pool2d to 1x1 of a channels_last tensor decomposes to a mean and an
    ``as_strided`` giving the result channels_last strides; it was refused as an unsupported op,
    so every classifier head and squeeze-excite block failed on a channels_last input."""
    torch.manual_seed(0)
    m = SqueezeExcite().eval().to(dtype)
    x = torch.randn(2, 8, 5, 5, dtype=dtype).to(memory_format=torch.channels_last)
    f = compile_module(m, (x,))
    with torch.no_grad():
        y, ref = f(x), m.double()(x.double())
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    assert y.dtype == dtype
    assert (y.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.parametrize("dynamic", [False, True])
def test_global_pool_of_a_channels_last_input_through_torch_compile(dynamic, tmp_path,
                                                                    monkeypatch):
    """torch.compile's functionalization keeps the decomposition's metadata mutation, the in-place
    ``as_strided_``, which was refused as an unsupported op: a channels_last classifier head or
    squeeze-excite block failed through ``torch.compile(backend="lumc")``."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.se = SqueezeExcite()

        def forward(self, x):
            return torch.cat([F.adaptive_avg_pool2d(x, 1).flatten(1), self.se(x).amax((2, 3))], 1)
    m = Head().eval()
    f = torch.compile(m, backend="lumc", dynamic=dynamic,
                      options={"budget": "10s", "device": "sim:h200", "max_size": 16})
    for shape in ((2, 8, 5, 5), (3, 8, 4, 7)) if dynamic else ((2, 8, 5, 5),):
        x = torch.randn(shape).to(memory_format=torch.channels_last)
        with torch.no_grad():
            y = f(x)
            ref = copy.deepcopy(m).double()(x.double())
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)


def test_adaptive_max_pool_through_torch_compile(tmp_path, monkeypatch):
    """make_fx leaves an unread ``getitem`` of adaptive max pooling's indices in the graph, which
    the check that nothing reads them counted as a reader: ``F.adaptive_max_pool2d`` through
    ``torch.compile(backend="lumc")`` was refused ("the indices output of adaptive max pooling")."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    m = Lambda(lambda x: F.adaptive_max_pool2d(x, (2, 3)) - F.adaptive_max_pool3d(x, (1, 2, 3)))
    f = torch.compile(m, backend="lumc", options={"budget": "10s", "device": "sim:h200"})
    x = torch.randn(2, 4, 5, 6)
    x[0, 1, 4, 5] = float("nan")
    x[1, 2, 0, 0] = float("inf")
    torch.testing.assert_close(f(x), m(x), rtol=0, atol=0, equal_nan=True)


def test_as_strided_reads_the_input_storage_in_its_traced_order():
    """A transposed read (strides (1, 3) over 12 elements) is a gather; an offset into a sliced
    input counts from the slice's storage; a read past the storage is refused in one line."""
    m = Lambda(lambda x: (x.as_strided((3, 4), (1, 3)) * 2, x[1:].as_strided((2, 2), (2, 1), 5)))
    x = torch.randn(12)
    f = compile_module(m, (x,))
    for y, ref in zip(f(x), m(x)):
        assert torch.equal(y, ref)
    with pytest.raises(UnsupportedOpError, match="as_strided reads storage its input does not"):
        compile_module(Lambda(lambda x: x.as_strided((3, 5), (1, 3))), (x,))


# ---- pooling -------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3])
def test_adaptive_avg_pool_keeps_an_inf_in_its_own_windows(size):
    """Unequal adaptive windows were one matmul with a constant [n_in, n_out] averaging matrix, so
    an inf met the zero weights of every other window: AdaptiveAvgPool1d(2) of [1, inf, 2, 3]
    gave [inf, nan] (eager [inf, 2.5]); a NaN likewise poisoned the whole axis."""
    nan, inf = float("nan"), float("inf")
    m = nn.AdaptiveAvgPool1d(size)
    for row in ([1.0, inf, 2.0, 3.0, 4.0], [nan, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0, -inf]):
        x = torch.tensor([[row]])
        y = compile_module(m, (x,))(x)
        assert torch.equal(y.isnan(), m(x).isnan()), (row, y, m(x))
        assert torch.allclose(y, m(x), rtol=1e-6, atol=0, equal_nan=True), (row, y, m(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("out", [(3, 5), (1, 2), (4, 4), (12, 9)])
def test_adaptive_avg_pool_against_eager(dtype, out):
    """Unequal, equal and enlarging windows; f16 is summed and divided in f32 and rounded once,
    as eager, so it matches exactly."""
    torch.manual_seed(1)
    m = nn.AdaptiveAvgPool2d(out)
    x = (torch.randn(2, 3, 8, 7) * 3).to(dtype)
    y, ref = compile_module(m, (x,))(x), m(x)
    assert y.dtype == dtype
    tol = 1e-14 if dtype == torch.float64 else 0.0
    assert (y - ref).abs().max().item() <= tol * ref.abs().max().item()


# ---- upsampling ----------------------------------------------------------------------------------
def test_bilinear_scale_factor_output_size_is_computed_in_double():
    """PyTorch sizes ``upsample_bilinear2d.vec`` as floor(in * scale) in double; lumc computed it in
    float32 (ONNX Resize's rule), so 90 rows at scale 1.3 lowered to 116 rows, eager 117, and a
    valid module was refused (45 at 1.4: 63 vs 62)."""
    torch.manual_seed(2)
    for rows, sf in ((90, 1.3), (45, 1.4)):
        m = Lambda(lambda x, sf=sf: nn.functional.interpolate(x, scale_factor=(sf, 1.0),
                                                              mode="bilinear"))
        x = torch.randn(1, 1, rows, 2)
        y, ref = compile_module(m, (x,))(x), m(x)
        assert y.shape == ref.shape
        assert (y - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("kw", [dict(size=(5, 13), align_corners=True),
                                dict(scale_factor=2.5), dict(size=(4, 3)),
                                dict(scale_factor=1.3, recompute_scale_factor=True)])
def test_bilinear_in_float64_interpolates_in_float64(kw):
    """Its coordinates were float32 whatever the dtype, so a float64 bilinear upsample was off by
    5e-7 (align_corners, 9x8 -> 5x13): PyTorch computes them in its opmath type, double here."""
    torch.manual_seed(3)
    m = Lambda(lambda x: nn.functional.interpolate(x, mode="bilinear", **kw))
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    y, ref = compile_module(m, (x,))(x), m(x)
    assert y.dtype == torch.float64 and (y - ref).abs().max().item() <= 1e-13


def test_group_norm_of_a_zero_size_batch():
    """native_group_norm's statistics reshaped to (N, group, -1), which N = 0 cannot infer:
    'cannot reshape (0, 4, 4, 4) to [0, 2, -1]'."""
    m = nn.GroupNorm(2, 4)
    x = torch.randn(0, 4, 4, 4)
    assert compile_module(m, (x,))(x).shape == (0, 4, 4, 4)
