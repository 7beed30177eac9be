"""ONNX ops and attributes the official backend suite found refused or wrong, each imported from a
one-node model and compared with onnxruntime (or numpy) at its edges: negative axes, zero-size
dims, rank 0, inf/NaN and -0.0 where the op passes them through."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.frontends.onnx_frontend import NeedsConstantError, import_onnx
from lumc.compiler.tools.onnx_backend import LumcBackend
from lumc.ir.errors import ShapeError

from tests.compiler.test_onnx_edge_values import assert_same_bits, onnxruntime_outputs, single_node
from tests.compiler.three_paths import run_triton

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


# ---- SpaceToDepth mode=CRD (opset 28): refused, the library had DCR only ----------------------
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


# ---- STFT and MelWeightMatrix (opset 17): not implemented; audio front ends compute both ---------
def _stft_model(x, step, window=None, frame_length=None, onesided=None):
    """A one-node STFT over the graph input ``x``; an omitted optional input is an empty name."""
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    names = ["x", "step", "", ""]
    if window is not None:
        inits.append(numpy_helper.from_array(window, "window"))
        names[2] = "window"
    if frame_length is not None:
        inits.append(numpy_helper.from_array(np.array(frame_length, np.int64), "flen"))
        names[3] = "flen"
    while not names[-1]:
        names.pop()
    node = helper.make_node("STFT", names, ["y0"],
                            **({} if onesided is None else dict(onesided=onesided)))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      list(x.shape))],
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _stft_numpy(x, step, window, flen, onesided):
    """The spec's STFT in float64: windowed frames, then numpy's FFT."""
    z = x[..., 0].astype(np.float64) + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
    flen = flen or (len(window) if window is not None else x.shape[1])
    w = np.ones(flen) if window is None else window.astype(np.float64)
    frames = (x.shape[1] - flen) // step + 1
    f = np.stack([z[:, i * step:i * step + flen] * w for i in range(frames)], axis=1)
    spec = np.fft.fft(f, axis=-1)[..., :flen // 2 + 1 if onesided in (None, 1) else flen]
    return np.stack([spec.real, spec.imag], -1)


@pytest.mark.parametrize("shape,step,flen,win,onesided", [
    ((2, 50, 1), 7, 16, False, None),      # the last samples fit no frame
    ((1, 33, 1), 4, 9, True, 1),           # odd frame: bins 9 // 2 + 1
    ((1, 24, 2), 5, 8, True, 0),           # a complex signal, all bins
    ((2, 20, 1), 3, None, True, 0),        # frame length from the window
    ((1, 12, 1), 1, None, False, 1),       # neither: one frame of the whole signal
    ((0, 16, 1), 4, 8, True, 1),           # zero-size batch
])
def test_stft_matches_numpy_fft(shape, step, flen, win, onesided):
    x = RNG.standard_normal(shape).astype(np.float32)
    n = flen if flen is not None else (6 if win else shape[1])
    window = np.hanning(n + 2)[1:-1].astype(np.float32) if win else None
    (got,) = lumc_outputs(_stft_model(x, step, window, flen, onesided), {"x": x})
    want = _stft_numpy(x, step, window, flen, onesided)
    assert got.dtype == np.float32 and got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


def test_stft_matches_onnxruntime():
    x = RNG.standard_normal((2, 41, 1)).astype(np.float32)
    m = _stft_model(x, 5, np.hamming(10).astype(np.float32), 10)
    (want,) = onnxruntime_outputs(m, {"x": x})
    (got,) = lumc_outputs(m, {"x": x})
    assert_same_bits(got, want, "stft", rtol=1e-5, atol=2e-5)


def test_stft_runs_in_triton_kernels():
    """The frames are window views of the signal and the DFT two contractions: the compiled
    program (Triton, interpreted on CPU) gives numpy's spectrum too."""
    x = RNG.standard_normal((2, 41, 1)).astype(np.float32)
    window = np.hamming(10).astype(np.float32)
    got = run_triton(_stft_model(x, 5, window, 10), {"x": x})["y0"]
    np.testing.assert_allclose(got, _stft_numpy(x, 5, window, 10, 1), rtol=1e-5, atol=2e-5)


def test_stft_nan_and_inf_spoil_only_their_frames():
    x = RNG.standard_normal((1, 40, 1)).astype(np.float32)
    x[0, 3, 0], x[0, 37, 0] = np.nan, np.inf
    (got,) = lumc_outputs(_stft_model(x, 8, frame_length=8), {"x": x})
    bad = ~np.isfinite(got).reshape(got.shape[1], -1)
    assert bad[0].all() and not bad[1:4].any() and bad[4].any(), bad.any(axis=1)


def test_stft_refuses_a_frame_longer_than_the_signal_in_one_line():
    x = np.zeros((1, 10, 1), np.float32)
    with pytest.raises(ShapeError) as e:
        lumc_outputs(_stft_model(x, 2, frame_length=16), {"x": x})
    assert "op STFT" in str(e.value) and "frame_length 16" in str(e.value)


@pytest.mark.parametrize("n_mel,dft,rate,lo,hi,out", [
    (8, 16, 8192, 0.0, 4096.0, 1),          # the official case
    (80, 400, 16000, 0.0, 8000.0, 1),       # Whisper's front end
    (40, 512, 22050, 125.0, 7600.0, 10),    # f16 output, a lower edge above 0
    (0, 64, 16000, 0.0, 8000.0, 1),         # no bands: [33, 0]
])
def test_mel_weight_matrix_matches_onnxruntime(n_mel, dft, rate, lo, hi, out):
    inits = {"n": np.array(n_mel, np.int64), "d": np.array(dft, np.int64),
             "r": np.array(rate, np.int64), "lo": np.array(lo, np.float32),
             "hi": np.array(hi, np.float32)}
    m = single_node("MelWeightMatrix", {}, inits, opset=17, output_datatype=out)
    # onnxruntime has f32 only; the f16 matrix is its f32 one rounded once
    (want,) = onnxruntime_outputs(single_node("MelWeightMatrix", {}, inits, opset=17), {})
    (got,) = lumc_outputs(m, {})
    assert_same_bits(got, want.astype(got.dtype), f"{n_mel} {dft} {rate}")
    assert got.dtype == (np.float16 if out == 10 else np.float32) and got.shape == (dft // 2 + 1,
                                                                                  n_mel)


def test_mel_weight_matrix_refuses_an_upper_edge_past_nyquist():
    inits = {"n": np.array(8, np.int64), "d": np.array(16, np.int64),
             "r": np.array(8000, np.int64), "lo": np.array(0, np.float32),
             "hi": np.array(12000, np.float32)}
    with pytest.raises(ShapeError) as e:
        lumc_outputs(single_node("MelWeightMatrix", {}, inits, opset=17), {})
    assert "op MelWeightMatrix" in str(e.value) and "upper_edge_hertz 12000" in str(e.value)


# ---- Compress and NonZero: not implemented; their size is a count of a compile-time value -------
@pytest.mark.parametrize("shape,cond,axis", [
    ((2, 3), [0, 1, 1], 1),
    ((2, 3, 2), [1, 0], -3),                 # negative axis
    ((2, 3), [1, 0, 1, 1, 0], None),         # flattened to 6, a condition of 5
    ((4, 3), [0, 1], 0),                     # shorter than the axis: the rest dropped
    ((3, 2), [1, 0, 1, 1, 1], -1),           # longer: the extra entries select nothing
    ((2, 3), [0, 0, 0], 1),                  # nothing selected: [2, 0]
    ((0, 3), [1, 1, 0], 1),                  # zero-size data
])
def test_compress_matches_onnxruntime(shape, cond, axis):
    x = RNG.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, -0.0, -np.inf][:x.size]
    m = single_node("Compress", {"x": x}, {"c": np.array(cond, bool)},
                    **({} if axis is None else dict(axis=axis)))
    (want,) = onnxruntime_outputs(m, {"x": x})
    (got,) = lumc_outputs(m, {"x": x})
    assert_same_bits(got, want, f"{shape} {cond} {axis}")


def test_compress_refuses_a_runtime_condition_and_rank_0_in_one_line():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(NeedsConstantError) as e:
        lumc_outputs(_compress_model([2, 3], cond=None, axis=1),
                     {"x": x, "c": np.array([1, 0, 1], bool)})
    msg = str(e.value)
    assert "op Compress" in msg and "condition" in msg and "\n" not in msg
    assert e.value.inputs == ["c"]
    x0 = np.array(1.0, np.float32)        # the spec's input has rank >= 1 (onnxruntime refuses)
    with pytest.raises(ShapeError, match="op Compress.*rank >= 1"):
        lumc_outputs(_compress_model([], cond=np.array([1], bool)), {"x": x0})


def _compress_model(shape, cond, **attrs):
    """Compress of the f32 input ``x``; ``cond`` an initializer, or a bool input ``c`` when None."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if cond is None:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, [3]))
    g = helper.make_graph([helper.make_node("Compress", ["x", "c"], ["y0"], **attrs)], "g", inputs,
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)],
                          [] if cond is None else [numpy_helper.from_array(cond, "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("x", [
    np.array([[0, -0.0, np.nan], [1, 0, np.inf]], np.float32),   # NaN nonzero, -0.0 zero
    np.array(3.0, np.float32), np.array(0.0, np.float32),        # rank 0: [1, count]
    np.zeros((2, 0, 3), np.float32),                             # zero-size: [3, 0]
    np.array([[[1, 0], [0, 7]], [[0, 0], [5, 0]]], np.int64),
])
def test_nonzero_matches_onnxruntime(x):
    """Through the ONNX backend, which binds the input as a constant (its values set the size)."""
    m = single_node("NonZero", {"x": x}, opset=13)
    (want,) = onnxruntime_outputs(m, {"x": x})
    (got,) = LumcBackend.prepare(m).run([x])
    assert_same_bits(got, want, str(x.shape))


def test_nonzero_of_a_constant_mask_gathers_runtime_data():
    """A mask known at compile time (a folded shape computation) feeding a Gather of an input:
    the model imports with NonZero folded and runs on any data."""
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    mask = np.array([0, 1, 0, 1, 1], bool)
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "zero"], ["idx"]),
             helper.make_node("Gather", ["x", "idx"], ["y0"], axis=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [5, 4])],
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(mask, "mask"),
                           numpy_helper.from_array(np.array([0], np.int64), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    (got,) = lumc_outputs(m, {"x": x})
    assert_same_bits(got, x[[1, 3, 4]], "gathered rows")


def test_nonzero_of_runtime_data_exits_2_at_the_cli(tmp_path):
    from click.testing import CliRunner

    from lumc.compiler.tools.cli import cli
    g = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"], name="nz1")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = tmp_path / "nz.onnx"
    path.write_bytes(m.SerializeToString())
    res = CliRunner().invoke(cli, ["compile", str(path), "--budget", "10s"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "node 'nz1', op NonZero" in lines[0], lines
    assert "count of nonzeros" in lines[0] and "Traceback" not in res.output


# ---- Scan in its opset-8 form (a batch axis, sequence_lens): refused ---------------------------
def _scan8_model(batch: int, length: int, seq_lens: list[int] | None, directions: list[int]):
    """``Scan`` (opset 8) of two f32 inputs ``[batch, length, 2]``: state ``s += a * b``, scan
    output ``s - a``."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["s_in", "ab"], ["s"]),
         helper.make_node("Sub", ["s", "a"], ["o"])], "body",
        [helper.make_tensor_value_info(n, f, [2]) for n in ("s_in", "a", "b")],
        [helper.make_tensor_value_info(n, f, [2]) for n in ("s", "o")])
    lens = "" if seq_lens is None else "lens"
    node = helper.make_node("Scan", [lens, "init", "x", "y"], ["final", "scanned"], body=body,
                            num_scan_inputs=2, directions=directions)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("init", f, [batch, 2]),
                      helper.make_tensor_value_info("x", f, [batch, length, 2]),
                      helper.make_tensor_value_info("y", f, [batch, length, 2])],
        [helper.make_tensor_value_info("final", f, None),
         helper.make_tensor_value_info("scanned", f, None)],
        [] if seq_lens is None else [numpy_helper.from_array(np.array(seq_lens, np.int64), "lens")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("batch,length,seq_lens,directions", [
    (1, 3, None, [0, 0]),
    (3, 4, [4, 1, 2], [0, 1]),        # short sequences (zero-padded), one input reversed
    (2, 5, [2, 5], [1, 1]),
])
def test_scan_opset8_matches_onnxruntime(batch, length, seq_lens, directions):
    feeds = {"init": RNG.standard_normal((batch, 2)).astype(np.float32),
             "x": RNG.standard_normal((batch, length, 2)).astype(np.float32),
             "y": RNG.standard_normal((batch, length, 2)).astype(np.float32)}
    feeds["x"][0, 0, 0] = np.nan                       # spoils that batch entry's first column
    m = _scan8_model(batch, length, seq_lens, directions)
    want = onnxruntime_outputs(m, feeds)
    got = lumc_outputs(m, feeds)
    for g, w, what in zip(got, want, ("final", "scanned")):
        assert_same_bits(g, w, what, rtol=1e-6, atol=1e-6)


def test_scan_opset8_empty_sequence_keeps_its_state():
    """A sequence of length 0 (the spec allows it; onnxruntime refuses it): its final state is
    its initial state and its scan output all padding."""
    feeds = {"init": RNG.standard_normal((2, 2)).astype(np.float32),
             "x": RNG.standard_normal((2, 3, 2)).astype(np.float32),
             "y": RNG.standard_normal((2, 3, 2)).astype(np.float32)}
    final, scanned = lumc_outputs(_scan8_model(2, 3, [0, 2], [0, 1]), feeds)
    init, x, y = feeds["init"], feeds["x"], feeds["y"]
    s = init[1] + x[1, 0] * y[1, 1]                  # y reversed over its 2 steps: y[1], then y[0]
    s2 = s + x[1, 1] * y[1, 0]
    assert_same_bits(final, np.stack([init[0], s2]), "final", rtol=1e-6)
    want = np.zeros((2, 3, 2), np.float32)
    want[1, :2] = [s - x[1, 0], s2 - x[1, 1]]
    assert_same_bits(scanned, want, "scanned", rtol=1e-6, atol=1e-6)


def test_scan_opset8_zero_size_batch():
    feeds = {"init": np.zeros((0, 2), np.float32), "x": np.zeros((0, 3, 2), np.float32),
             "y": np.zeros((0, 3, 2), np.float32)}
    final, scanned = lumc_outputs(_scan8_model(0, 3, None, [0, 0]), feeds)
    assert final.shape == (0, 2) and scanned.shape == (0, 3, 2)
    assert final.dtype == scanned.dtype == np.float32


def test_scan_opset8_refuses_a_sequence_longer_than_the_input():
    feeds = {k: np.zeros(s, np.float32) for k, s in
             (("init", (2, 2)), ("x", (2, 3, 2)), ("y", (2, 3, 2)))}
    with pytest.raises(ShapeError, match=r"op Scan.*sequence_lens \[4, 1\]"):
        lumc_outputs(_scan8_model(2, 3, [4, 1], [0, 0]), feeds)


# ---- Det: not implemented; LU with partial pivoting, unrolled ------------------------------------
@pytest.mark.parametrize("shape,dtype", [
    ((3, 3), np.float32),            # rank 2: a 0-d determinant
    ((4, 2, 2), np.float32),
    ((2, 3, 5, 5), np.float64),
    ((1, 1), np.float32),
    ((0, 4, 4), np.float32),         # zero-size batch
])
def test_det_matches_numpy_and_onnxruntime(shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    m = _det_model(shape, dtype)
    (got,) = lumc_outputs(m, {"x": x})
    want = np.linalg.det(x.astype(np.float64))
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dtype == np.float32:                   # onnxruntime has Det for float32 only
        (ort,) = onnxruntime_outputs(m, {"x": x})
        np.testing.assert_allclose(got, ort, rtol=tol, atol=tol)


def _det_model(shape, dtype=np.float32):
    t = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    g = helper.make_graph([helper.make_node("Det", ["x"], ["y0"])], "g",
                          [helper.make_tensor_value_info("x", t, list(shape))],
                          [helper.make_tensor_value_info("y0", t, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_det_of_singular_matrices_is_zero_and_nan_propagates():
    x = np.array([[[1, 2, 3], [2, 4, 6], [0, 1, 1]],        # dependent rows
                  [[0, 1, 2], [0, 3, 4], [0, 5, 6]],        # a zero column: the first pivot is 0
                  [[0, 1, 0], [1, 0, 0], [0, 0, 1]],        # one swap: -1
                  [[1, np.nan, 0], [0, 1, 0], [0, 0, 1]],
                  [[np.inf, 0, 0], [0, 1, 0], [0, 0, 1]]], np.float32)
    (got,) = lumc_outputs(single_node("Det", {"x": x}, opset=13), {"x": x})
    assert got[0] == 0 and got[1] == 0 and got[2] == -1, got
    assert np.isnan(got[3]) and got[4] == np.inf, got
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(np.linalg.det(x)))


def test_det_of_an_empty_matrix_is_one_and_a_non_square_one_is_refused():
    x = np.zeros((2, 0, 0), np.float32)
    (got,) = lumc_outputs(single_node("Det", {"x": x}, opset=13), {"x": x})
    assert_same_bits(got, np.ones(2, np.float32), "0x0")
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"op Det.*\[\.\.\., n, n\], got \[2, 3\]"):
        lumc_outputs(_det_model((2, 3)), {"x": x})


# ---- RoiAlign: not implemented; bilinear samples by Gather, separable for avg ------------------
ROIS = np.array([[1.0, 1.0, 7.5, 6.0], [-3.0, 2.0, 4.0, 14.0], [0.0, 0.0, 12.0, 10.0],
                 [5.2, 3.1, 5.6, 3.3], [9.0, 8.0, 20.0, 12.0]], np.float32)


def _roi_align_model(x_shape, rois: np.ndarray | None, n_rois: int, opset: int = 16, **attrs):
    """RoiAlign of the f32 input ``x``; ``rois`` an initializer, or an input when None."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
              helper.make_tensor_value_info("b", TensorProto.INT64, [n_rois])]
    inits = []
    if rois is None:
        inputs.append(helper.make_tensor_value_info("rois", TensorProto.FLOAT, [n_rois, 4]))
    else:
        inits.append(numpy_helper.from_array(rois, "rois"))
    g = helper.make_graph([helper.make_node("RoiAlign", ["x", "rois", "b"], ["y0"], **attrs)],
                          "g", inputs, [helper.make_tensor_value_info("y0", TensorProto.FLOAT,
                                                                      None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm,ratio,scale", [
    ("half_pixel", 2, 1.0), ("output_half_pixel", 3, 0.5),
    ("half_pixel", 0, 1.0),            # adaptive grid: ceil(box / bins) per roi and axis
    ("output_half_pixel", 0, 0.75),
])
def test_roi_align_matches_onnxruntime(mode, ctm, ratio, scale):
    """Boxes inside, across the border and past it, one thinner than a pixel; rois of the two
    images in any order."""
    x = RNG.standard_normal((2, 3, 10, 12)).astype(np.float32)
    b = np.array([1, 0, 0, 1, 1], np.int64)
    m = _roi_align_model(x.shape, ROIS, 5, mode=mode, coordinate_transformation_mode=ctm,
                         sampling_ratio=ratio, spatial_scale=scale, output_height=3,
                         output_width=4)
    (want,) = onnxruntime_outputs(m, {"x": x, "b": b})
    (got,) = lumc_outputs(m, {"x": x, "b": b})
    if mode == "avg":
        assert_same_bits(got, want, f"{mode} {ctm} {ratio}", rtol=1e-5, atol=1e-6)
    else:   # a bin of zero-weight taps is the max of +0 and -0 products: either sign is a tie
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_roi_align_with_runtime_rois_and_no_rois():
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    b = np.array([0, 1, 1, 0, 1], np.int64)
    m = _roi_align_model(x.shape, None, 5, sampling_ratio=2, output_height=2, output_width=2)
    feeds = {"x": x, "b": b, "rois": ROIS}
    (got,) = lumc_outputs(m, feeds)
    assert_same_bits(got, onnxruntime_outputs(m, feeds)[0], "runtime rois", rtol=1e-5, atol=1e-6)
    empty = {"x": x, "b": np.zeros(0, np.int64)}
    (got,) = lumc_outputs(_roi_align_model(x.shape, np.zeros((0, 4), np.float32), 0,
                                           sampling_ratio=2), empty)
    assert got.shape == (0, 4, 1, 1) and got.dtype == np.float32
    with pytest.raises(NeedsConstantError, match="op RoiAlign.*sampling_ratio 0"):
        lumc_outputs(_roi_align_model(x.shape, None, 5, sampling_ratio=0), feeds)


# ---- Unique: not implemented; constants of an input known at compile time ------------------------
@pytest.mark.parametrize("x,attrs", [
    (np.array([2, 1, 5, 1, 2, 7, 5], np.float32), {}),
    (np.array([2, 1, 5, 1, 2, 7, 5], np.float32), dict(sorted=0)),
    (np.array([[1, 0, 1], [2, 3, 2], [1, 0, 1]], np.int64), dict(axis=-1, sorted=0)),
    (np.array([[1, 0, 1], [2, 3, 2], [1, 0, 1]], np.int64), dict(axis=0)),
    (np.array([[4, 4], [3, 4]], np.int64), {}),        # flattened
    (np.array(3.0, np.float32), {}),                     # rank 0: one element
    (np.zeros((0, 3), np.float32), {}),                  # zero-size: empty outputs
])
def test_unique_matches_onnxruntime(x, attrs):
    """Through the ONNX backend, which binds the input as a constant (its values set Y's size)."""
    m = single_node("Unique", {"x": x}, opset=11, n_out=4, **attrs)
    want = onnxruntime_outputs(m, {"x": x})
    got = LumcBackend.prepare(m).run([x])
    for g, w, what in zip(got, want, ("Y", "indices", "inverse_indices", "counts")):
        assert_same_bits(g, w, f"{what} {attrs}")


def test_unique_keeps_one_nan_and_the_first_signed_zero():
    """NaNs are one value (numpy, the ONNX reference; onnxruntime drops them from Y), -0.0 and 0.0
    one, Y holding the sign of the first occurrence."""
    x = np.array([2, np.nan, 0.0, np.nan, -0.0, 2], np.float32)
    y, first, inverse, counts = LumcBackend.prepare(
        single_node("Unique", {"x": x}, opset=11, n_out=4, sorted=0)).run([x])
    assert_same_bits(y, np.array([2, np.nan, 0.0], np.float32), "Y")
    assert first.tolist() == [0, 1, 2] and counts.tolist() == [2, 2, 2]
    assert inverse.tolist() == [0, 1, 2, 1, 2, 0]
    x = np.array([-0.0, 1, 0.0], np.float32)
    (y,) = LumcBackend.prepare(single_node("Unique", {"x": x}, opset=11)).run([x])
    assert_same_bits(y, np.array([-0.0, 1], np.float32), "sorted Y")


def test_unique_of_runtime_data_is_refused_in_one_line():
    x = np.array([1, 2, 1], np.float32)
    with pytest.raises(NeedsConstantError, match="op Unique.*count of distinct values"):
        lumc_outputs(single_node("Unique", {"x": x}, opset=11), {"x": x})
