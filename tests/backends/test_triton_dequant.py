"""Weights stored as fp8 and NVFP4 dequantized in a contraction kernel's prologue, run in Triton
(the interpreter on CPU): one ``matmul`` kernel that reads the stored bytes (e4m3, packed uint8),
whose dequantized weights equal numpy's exactly and whose product matches numpy in fp32."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.launch import TritonKernel, to_numpy, to_torch
from lumc.compiler.core.fusion import greedy_program
from lumc.compiler.core.precision import PrecisionPolicy, store_weights
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def numpy_dequant(consts: dict, fmt: str, shape) -> np.ndarray:
    """The stored weight decoded by numpy from its constants (K is axis 0)."""
    if fmt == "fp8":
        return consts["f8e4m3fn"].astype(np.float32) * consts["f32"]
    p, s, ts = consts["u8"], consts["f8e4m3fn"], consts["ts"]
    vals = np.stack([E2M1[p & 15], E2M1[p >> 4]], axis=1).reshape(shape)
    return (vals * np.repeat(s.astype(np.float32), 16, axis=0)) * ts


def weight_kernel(fmt: str, m: int, k: int, n: int, seed: int = 0):
    """The one kernel greedy fusion makes of ``x @ W`` with ``W`` stored as ``fmt``, the numpy
    dequantization of what it stores, and the weight."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32) * np.linspace(0.05, 3, n, dtype=np.float32)
    w[:, 1] = 0.0
    w[5, 2] = 40.0
    x = Tensor(input_node("x", (m, k), dt.f32))
    g, stats = store_weights(Graph({"x": x.node}, {"y": (x @ Tensor.const(w)).node}),
                             PrecisionPolicy("fp32", fmt))
    assert stats[fmt] == 1
    prog = greedy_program(g)
    assert [c.kernel.form for c in prog.calls] == ["matmul"], prog.notes
    call = prog.calls[0]
    consts = {n.dtype.name: n.arg.value for n in call.inputs if n.op == "Constant"
              and n.shape != (256, 2)}
    if fmt == "nvfp4":
        ts = [c for c in g.nodes() if c.op == "Constant" and c.numel == 1 and c.dtype == dt.f32]
        consts["ts"] = ts[0].arg.value
    return call, numpy_dequant(consts, fmt, (k, n)), w


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dequant_prologue_is_one_matmul_kernel_reading_the_stored_bytes(fmt):
    call, _, _ = weight_kernel(fmt, 8, 48, 40)
    kinds = {(n.op, n.dtype.name, n.shape) for n in call.inputs}
    if fmt == "nvfp4":   # packed codes, e4m3 block scales, the decode table; no f32 weight
        assert kinds == {("Input", "f32", (8, 48)), ("Constant", "u8", (24, 40)),
                         ("Constant", "f8e4m3fn", (3, 40)), ("Constant", "f32", (256, 2))}
    else:
        assert kinds == {("Input", "f32", (8, 48)), ("Constant", "f8e4m3fn", (48, 40)),
                         ("Constant", "f32", (1, 40))}
    tk = TritonKernel(call.kernel)
    assert tk.rendered.variant == "dot" and "tl.dot(" in tk.source
    stored_bytes = sum(n.nbytes for n in call.inputs if n.op == "Constant")
    assert stored_bytes < 48 * 40 * (1.1 if fmt == "fp8" else 0.6) + 2048


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dequantized_weights_in_triton_equal_numpy(fmt):
    k, n = 48, 40     # K not a multiple of the BLOCK_K tiles, N ragged
    call, want, w = weight_kernel(fmt, k, k, n)
    tk = TritonKernel(call.kernel)
    consts = [c.arg.value for c in call.inputs[1:]]
    eye = np.eye(k, dtype=np.float32)             # I @ W' is W' exactly (one product per sum)
    got = to_numpy(tk(eye, *consts)[0]).reshape(k, n)
    np.testing.assert_array_equal(got, want)
    ref = ReferenceExecutor(call.kernel.meaning)(
        {f"in{i}": v for i, v in enumerate([eye] + consts)})["out0"].reshape(k, n)
    np.testing.assert_array_equal(ref, want)
    rel = np.abs(want - w).max() / np.abs(w).max()
    assert 0 < rel < (2.0 ** -4 if fmt == "fp8" else 0.1)   # really quantized, and close


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dequant_matmul_in_triton_matches_numpy(fmt):
    m, k, n = 13, 64, 40
    call, want, _ = weight_kernel(fmt, m, k, n, seed=2)
    x = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    got = to_numpy(TritonKernel(call.kernel)(x, *[c.arg.value for c in call.inputs[1:]])[0])
    ref = x.astype(np.float64) @ want.astype(np.float64)
    np.testing.assert_allclose(got.reshape(m, n), ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_float8_moves_to_torch_by_its_bits():
    import torch
    a = np.float32([0, -0.0, 1.5, -448, 0.001953125, 240]).astype(ml_dtypes.float8_e4m3fn)
    t = to_torch(a, "cpu")
    assert t.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(t.float().numpy(), a.astype(np.float32))
    np.testing.assert_array_equal(to_numpy(t).view(np.uint8), a.view(np.uint8))
    b = np.float32([1, -2, 57344]).astype(ml_dtypes.float8_e5m2)
    assert to_torch(b, "cpu").dtype == torch.float8_e5m2
    np.testing.assert_array_equal(to_numpy(to_torch(b, "cpu")).view(np.uint8), b.view(np.uint8))
