"""ONNX ``Attention`` (opset 23) compiles to the attention form (one kernel, or SDPA) where the
probabilities are not an output, with the ONNX reference's values: a query with no attendable key
gives zeros, a causal mask skips nothing it should not."""
import numpy as np
import pytest
from onnx import TensorProto as TP, helper
from onnx.reference import ReferenceEvaluator

import lumc


def _model(causal: bool, mask: str | None, hq: int = 4, hk: int = 4):
    ins = ["q", "k", "v"] + (["m"] if mask else [])
    node = helper.make_node("Attention", ins, ["y"], is_causal=int(causal))
    vi = [helper.make_tensor_value_info("q", TP.FLOAT, [2, hq, 24, 16])]
    vi += [helper.make_tensor_value_info(n, TP.FLOAT, [2, hk, 40, 16]) for n in "kv"]
    if mask:
        vi.append(helper.make_tensor_value_info(
            "m", TP.BOOL if mask == "bool" else TP.FLOAT, [2, 1, 24, 40]))
    g = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]), ins


@pytest.mark.parametrize("causal,mask,hk", [(True, None, 4), (False, "bool", 4),
                                            (False, "float", 2), (True, "bool", 4)])
def test_attention_op_forms_attention_with_the_reference_values(tmp_path, monkeypatch, causal,
                                                                mask, hk):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m, ins = _model(causal, mask, hk=hk)
    rng = np.random.default_rng(0)
    feed = {"q": rng.standard_normal((2, 4, 24, 16)).astype(np.float32)}
    feed.update({n: rng.standard_normal((2, hk, 40, 16)).astype(np.float32) for n in "kv"})
    if mask == "bool":
        mk = rng.random((2, 1, 24, 40)) < 0.7
        mk[1, 0, 5] = False                                    # a query with no key
        feed["m"] = mk
    elif mask == "float":
        mk = np.where(rng.random((2, 1, 24, 40)) < 0.7, 0.5, -np.inf).astype(np.float32)
        mk[0, 0, 7] = -np.inf
        feed["m"] = mk
    want = ReferenceEvaluator(m).run(None, feed)[0]
    f = lumc.compile(m.SerializeToString(), budget="20s", device="sim:h200")
    got = f(*[feed[n] for n in ins])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    forms = [k["form"] for k in f.report_dict()["per_kernel"]]
    assert "attention" in forms and len(forms) <= 2, forms   # (+ the row flag's reduction)
