"""A transformers decoder compiled for a size range (``dynamic_shapes``): its mask and position
setup (the packed-sequence check ``cumsum(diff(position_ids) != 1)``, gathers of ``arange`` by its
wrapped index) is proved at every size (``lumc.compiler.core.iota_facts``) and leaves no kernel,
as at a fixed shape; the plan matches eager at the range's ends and inside it."""
import pytest
import torch
from torch.export import Dim

import lumc


class _Hidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).last_hidden_state


def test_llama_range_has_no_index_setup_kernels(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, vocab_size=97,
                                   max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    mod = _Hidden(transformers.LlamaModel(cfg).eval()).eval()
    f = lumc.compile(mod, budget="30s", example_inputs=(torch.randint(0, 97, (1, 48)),),
                     dynamic_shapes=({1: Dim("seq", min=2, max=64)},), device="sim:h200")
    for _, cm in f.variants:
        forms = cm.report_dict()["form_counts"]
        # the embedding's gather alone (before: + 3 pointwise, 4 gathers and the cumsum's
        # reduction in every bucket); as at a fixed shape
        assert forms.get("gather") == 1 and "reduction" not in forms and "pointwise" not in forms, forms
    g = torch.Generator().manual_seed(1)
    for n in (2, 3, 17, 63, 64):
        ids = torch.randint(0, 97, (1, n), generator=g)
        with torch.no_grad():
            got, want = f(ids), mod(ids)
        assert got.shape == want.shape
        assert float((got - want).abs().max() / want.abs().max()) <= 1e-4, n
