"""ONNX ops and attributes the official backend suite found refused or wrong, each imported from a
one-node model and compared with onnxruntime (or numpy) at its edges: negative axes, zero-size
dims, rank 0, inf/NaN and -0.0 where the op passes them through."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import import_onnx
from lumc.ir.errors import ShapeError

from tests.compiler.test_onnx_edge_values import assert_same_bits, onnxruntime_outputs, single_node

RNG = np.random.default_rng(11)


def lumc_outputs(m, feeds: dict) -> list[np.ndarray]:
    imported = import_onnx(m, {k: v.shape for k, v in feeds.items()})
    out = ReferenceExecutor(imported.graph)(feeds)
    return [out[o.name] for o in m.graph.output]


# ---- Resize antialias (opset 18): the frontend refused it though the library has the filters ----
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("axes,scales,shape", [
    ([-2, -1], [0.4, 0.6], (2, 3, 13, 11)),     # negative axes
    ([3], [0.35], (1, 2, 5, 17)),               # one axis, a wide filter (1 / 0.35 taps per side)
    (None, [1, 1, 0.5, 0.7], (0, 3, 8, 10)),    # zero-size batch
    (None, [1, 1, 0.5, 1.5], (1, 2, 9, 4)),     # downsampled and upsampled axes together
])
def test_resize_antialias_matches_onnxruntime(mode, axes, scales, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    attrs = dict(mode=mode, antialias=1) | ({} if axes is None else dict(axes=axes))
    m = single_node("Resize", {"x": x}, {"roi": np.zeros(0, np.float32),
                                         "scales": np.array(scales, np.float32)}, **attrs)
    (want,) = onnxruntime_outputs(m, {"x": x})
    (got,) = lumc_outputs(m, {"x": x})
    assert_same_bits(got, want, f"{mode} {axes} {scales}", rtol=1e-5, atol=1e-6)


def test_resize_antialias_by_sizes_widens_the_filter():
    """By sizes, antialias must differ from the plain filter when shrinking (the plain result was
    computed silently before the attribute was read)."""
    x = RNG.standard_normal((1, 1, 12, 12)).astype(np.float32)
    sizes = np.array([1, 1, 3, 5], np.int64)
    inits = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32), "sizes": sizes}
    got = {aa: lumc_outputs(single_node("Resize", {"x": x}, inits, mode="linear", antialias=aa),
                            {"x": x})[0] for aa in (0, 1)}
    want = onnxruntime_outputs(single_node("Resize", {"x": x}, inits, mode="linear", antialias=1),
                               {"x": x})[0]
    assert_same_bits(got[1], want, "sizes", rtol=1e-5, atol=1e-6)
    assert np.abs(got[1] - got[0]).max() > 1e-2


# ---- SpaceToDepth mode=CRD (opset 28): refused, the library had DCR only --------------------------
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape,b", [((2, 3, 6, 9), 3), ((0, 2, 4, 4), 2), ((1, 1, 2, 2), 1)])
def test_space_to_depth_modes_match_onnxruntime(mode, shape, b):
    x = RNG.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -0.0][:x.size]   # views pass every bit through
    m = single_node("SpaceToDepth", {"x": x}, opset=28, blocksize=b, mode=mode)
    (want,) = onnxruntime_outputs(m, {"x": x})
    (got,) = lumc_outputs(m, {"x": x})
    assert_same_bits(got, want, f"{mode} {shape} {b}")


def test_space_to_depth_crd_inverts_depth_to_space_crd():
    x = RNG.standard_normal((2, 12, 3, 5)).astype(np.float32)
    d2s = single_node("DepthToSpace", {"x": x}, opset=28, blocksize=2, mode="CRD")
    (y,) = lumc_outputs(d2s, {"x": x})
    (back,) = lumc_outputs(single_node("SpaceToDepth", {"x": y}, opset=28, blocksize=2,
                                       mode="CRD"), {"x": y})
    assert_same_bits(back, x, "round trip")


def test_space_to_depth_unknown_mode_is_one_line():
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(ShapeError) as e:
        lumc_outputs(single_node("SpaceToDepth", {"x": x}, opset=28, blocksize=2, mode="RDC"),
                     {"x": x})
    assert "op SpaceToDepth" in str(e.value) and "unknown mode 'RDC'" in str(e.value)
    assert "\n" not in str(e.value)
