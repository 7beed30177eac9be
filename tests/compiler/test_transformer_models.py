"""The GPU check's own GPT-2 and BERT (``lumc.compiler.tools.transformer_models``, what
``make gpu-check`` races against torch): compiled for ``sim:h200`` they take the forms lumc is
measured by (flash attention, the norms formed on load: 5 kernels per layer) and match eager."""
from __future__ import annotations

import pytest
import torch

import lumc
from lumc.compiler.tools.transformer_models import BERT, GPT2


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_reference_transformers_compile_to_five_kernels_per_layer(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    kw = dict(layers=2, width=64, heads=4, vocab=100, positions=64)
    mod = (BERT(**kw) if arch == "bert" else GPT2(**kw)).eval()
    ids = torch.randint(0, 100, (1, 24))
    mask = torch.ones(1, 24, dtype=torch.int64)
    mask[:, 20:] = 0
    args = (ids, mask) if arch == "bert" else (ids,)
    f = lumc.compile(mod, budget="40s", example_inputs=args, device="sim:h200")
    with torch.no_grad():
        got, want = f(*args), mod(*args)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-4
    r = f.specializations[0].compiled.report_dict()
    forms = r["form_counts"]
    assert forms.get("attention") == 2 and forms.get("softmax", 0) == 0, forms
    # per layer: QKV, attention, out-projection, up, down; the norms formed on load (BERT keeps
    # its last one, the output; GPT-2 its embedding gather and the LM head)
    assert r["kernels"] <= 5 * 2 + 2, (r["kernels"], forms, r["candidate_label"])


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_half_precision_models_get_the_attention_form(arch):
    """A bf16 module's attention: the scores rounded to bf16, the softmax widened to f32 and
    rounded back (the library's spelling): the e-graph still forms flash attention."""
    from lumc.compiler.core.egraph_pipeline import egraph_candidates
    from lumc.compiler.frontends.torch_frontend.capture import import_torch
    torch.manual_seed(0)
    kw = dict(layers=1, width=64, heads=4, vocab=100, positions=64)
    mod = (BERT(**kw) if arch == "bert" else GPT2(**kw)).eval().to(torch.bfloat16)
    ids = torch.randint(0, 100, (1, 16))
    args = (ids, torch.ones(1, 16, dtype=torch.int64)) if arch == "bert" else (ids,)
    best = egraph_candidates(import_torch(mod, args).graph, "h200", k=4).best
    forms = best.form_counts()
    assert forms.get("attention") == 1 and "softmax" not in forms, forms


def test_reference_llama_compiles_to_five_kernels_per_layer(tmp_path, monkeypatch):
    """The GPU check's Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU): per layer the merged
    QKV with the norm on load, attention computing RoPE, out-projection + residual, the paired
    gate/up with the norm on load, down-projection + residual; plus the embedding gather and the
    final norm. Matches eager."""
    from lumc.compiler.tools.transformer_models import Llama
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    mod = Llama(layers=2, width=64, heads=4, kv_heads=2, ffn=96, vocab=100, positions=64).eval()
    ids = torch.randint(0, 100, (1, 24))
    f = lumc.compile(mod, budget="40s", example_inputs=(ids,), device="sim:h200")
    with torch.no_grad():
        got, want = f(ids), mod(ids)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-4
    r = f.specializations[0].compiled.report_dict()
    forms = r["form_counts"]
    assert forms.get("attention") == 2 and forms.get("pointwise", 0) == 0, forms
    assert r["kernels"] <= 5 * 2 + 2, (r["kernels"], forms, r["candidate_label"])
    matmuls = [k for k in r["per_kernel"] if k["form"] == "matmul"]
    assert len(matmuls) == 8, r["per_kernel"]     # 4 per layer: QKV, o, gate/up, down
