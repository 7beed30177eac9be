"""The generated source itself: readable, cached by content hash, imported from the cache; config
spaces are legal data; meanings that do not fit a form are refused with the reason."""
from __future__ import annotations

import importlib
import os

import pytest

from lumc.ir import dtypes as dt
from lumc.backends.triton import cache, configs, render
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.launch import TritonKernel
from lumc.backends.triton.source import assemble
from triton_cases import (attention, check, layernorm_kernel, make_kernel, matmul_kernel,
                          softmax_kernel)


def _kernels():
    return {
        "pointwise": make_kernel("pointwise", lambda a, b: a * b + 1.0, [((7, 5), dt.f32)] * 2),
        "reduction": make_kernel("reduction", lambda a: a.sum(-1), [((7, 5), dt.f32)]),
        "softmax": softmax_kernel((7, 33), dt.f16),
        "layernorm": layernorm_kernel((7, 33), dt.f32),
        "matmul": matmul_kernel(17, 9, 5, dt.f16),
        "attention": make_kernel("attention", attention(0.5), [((2, 9, 16), dt.f32)] * 3),
    }


@pytest.mark.parametrize("form", list(_kernels()))
def test_source_is_readable(form):
    k = _kernels()[form]
    src = render(k).source
    assert src.startswith(f"# lumc generated kernel: form {form}")
    assert "# covers model nodes:" in src and "# meaning" in src
    assert "in0_ptr" in src and "out0_ptr" in src and "@triton.jit" in src and "def launch(" in src
    # every line of the kernel stays short enough to read
    assert max(len(ln) for ln in src.splitlines()) < 200


def test_covers_names_the_model_nodes():
    from lumc.ir.kernels import Kernel
    k = _kernels()["pointwise"]
    k2 = Kernel(k.form, k.meaning, k.attrs, covers=("%12 Add", "%13 Mul"))
    assert "# covers model nodes: %12 Add, %13 Mul" in render(k2).source


def test_cache_file_keyed_by_content_and_imported_from_there(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    k = _kernels()["reduction"]
    rk = render(k)
    path = cache.write_source(rk)
    assert path.parent == tmp_path / "kernels" and path.name == f"{rk.name}.py"
    assert rk.digest in rk.name and path.read_text() == rk.source
    mtime = os.stat(path).st_mtime_ns
    assert cache.write_source(rk) == path and os.stat(path).st_mtime_ns == mtime  # not rewritten
    cache._MODULES.pop(rk.name, None)
    mod = cache.load_module(rk)
    assert mod.__file__ == str(path)
    assert hasattr(mod, rk.name) and hasattr(mod, "launch")
    # same meaning, same name: the hash is of the content
    assert render(make_kernel("reduction", lambda a: a.sum(-1), [((7, 5), dt.f32)])).name == rk.name
    importlib.invalidate_caches()


def test_different_content_different_name():
    a = render(make_kernel("pointwise", lambda x: x * 2.0, [((7,), dt.f32)]))
    b = render(make_kernel("pointwise", lambda x: x * 3.0, [((7,), dt.f32)]))
    assert a.name != b.name


def test_weight_constants_are_pointer_arguments():
    import numpy as np
    from lumc.ir.tensor import Tensor
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    k = make_kernel("pointwise", lambda a: a * Tensor.const(w), [((3, 4), dt.f32)])
    tk = check(k)
    assert "const0_ptr" in tk.source


@pytest.mark.parametrize("form", list(_kernels()))
def test_config_space_is_data_and_legal(form):
    rk = render(_kernels()[form])
    space = configs.config_space(rk.config_space, rk.problem)
    assert space, form
    for c in space:
        kw = c.kwargs()
        for name, v in c.blocks:
            if name == "PRECISION":                     # the tl.dot operand precision knob
                assert v in ("ieee", "tf32x3", "tf32", "bf16", "fp16", "fp8"), v
                continue
            assert v & (v - 1) == 0, (name, v)          # powers of two
        assert configs.shared_memory_estimate(rk.config_space, rk.problem, kw) <= configs.SMEM_LIMIT
    # blocks no larger than the problem needs
    if rk.config_space == "pointwise":
        assert all(c["BLOCK"] <= max(128, configs.next_pow2(rk.problem["N"])) for c in space)
    if rk.config_space == "row":
        assert all(c["BLOCK_M"] <= configs.next_pow2(rk.problem["M"]) for c in space)


def test_default_config_is_in_the_space():
    for form, k in _kernels().items():
        rk = render(k)
        d = configs.default_config(rk.config_space, rk.problem)
        assert d in configs.config_space(rk.config_space, rk.problem), (form, d)


def test_meaning_that_does_not_fit_is_refused():
    two = make_kernel("matmul", lambda a, b, c: (a @ b) @ c,
                      [((4, 5), dt.f32), ((5, 6), dt.f32), ((6, 7), dt.f32)])
    with pytest.raises(RenderError, match="exactly one"):
        render(two)
    mixed = make_kernel("reduction", lambda a: (a.sum(0), a.sum(1)), [((4, 5), dt.f32)])
    with pytest.raises(RenderError, match="share operand shape and axes"):
        render(mixed)


def test_assemble_launcher_has_the_grid():
    rk = render(_kernels()["matmul"])
    assert "grid = (triton.cdiv(17, BLOCK_M) * triton.cdiv(5, BLOCK_N), 1,)" in rk.source
    assert TritonKernel(_kernels()["matmul"]).default_config()["BLOCK_M"] >= 16
    assert assemble  # the public assembler is importable for other renderers
