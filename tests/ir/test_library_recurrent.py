"""lumc.ir.library.recurrent (LSTM, GRU, RNN) against onnxruntime, the ONNX reference evaluator
(layout 1, which onnxruntime refuses) and torch.nn.LSTM/GRU with copied weights."""
import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, ShapeError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import recurrent as RC
from lumc.ir.tensor import Tensor

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(5)
SEQ, BATCH, INP, HID = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
FNS = {"LSTM": RC.lstm, "GRU": RC.gru, "RNN": RC.rnn}
ATOL = {"f32": 2e-6, "f16": 4e-3}


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def operands(op, direction, layout=0, lens=None, peepholes=False):
    """``[(name, array or None)]`` in the ONNX input order of ``op``."""
    d, g = (2 if direction == "bidirectional" else 1), GATES[op]
    x_shape = (SEQ, BATCH, INP) if layout == 0 else (BATCH, SEQ, INP)
    h_shape = (d, BATCH, HID) if layout == 0 else (BATCH, d, HID)
    ins = [("X", randn(*x_shape)), ("W", randn(d, g * HID, INP, scale=0.5)),
           ("R", randn(d, g * HID, HID, scale=0.5)), ("B", randn(d, 2 * g * HID, scale=0.5)),
           ("sequence_lens", None if lens is None else np.array(lens, np.int32)),
           ("initial_h", randn(*h_shape))]
    if op == "LSTM":
        ins += [("initial_c", randn(*h_shape)), ("P", randn(d, 3 * HID) if peepholes else None)]
    return ins


def lumc_run(op, ins, compute=None, **attrs):
    nodes = {k: input_node(k, a.shape, dt.from_numpy(a.dtype)) for k, a in ins if a is not None}
    args = []
    for k, a in ins:
        t = Tensor(nodes[k]) if a is not None else None
        if t is not None and compute is not None and t.dtype.is_float:
            t = t.cast(compute)
        args.append(t)
    outs = FNS[op](*args, hidden_size=HID, **attrs)
    g = Graph(nodes, {f"y{k}": o.node for k, o in enumerate(outs)})
    return list(ReferenceExecutor(g)({k: a for k, a in ins if a is not None}).values())


def onnx_model(op, ins, opset=14, **attrs):
    names = [k if a is not None else "" for k, a in ins]
    while names and names[-1] == "":
        names.pop()
    vi = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for k, a in ins if a is not None]
    nout = 3 if op == "LSTM" else 2
    outs = [helper.make_empty_tensor_value_info(f"y{k}") for k in range(nout)]
    node = helper.make_node(op, names, [o.name for o in outs], hidden_size=HID, **attrs)
    return helper.make_model(helper.make_graph([node], "g", vi, outs),
                             opset_imports=[helper.make_opsetid("", opset)])


def ort_run(op, ins, **attrs):
    m = onnx_model(op, ins, **attrs)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {k: a for k, a in ins if a is not None})


def assert_all_close(got, want, atol=ATOL["f32"]):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-5,
                                   atol=atol)


DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("variant", ["plain", "peephole_clip_lens", "input_forget"])
def test_lstm_matches_onnxruntime(direction, variant):
    attrs = {"direction": direction}
    lens = None
    if variant == "peephole_clip_lens":
        lens, attrs["clip"] = [5, 2, 4], 0.8
    if variant == "input_forget":
        attrs["input_forget"] = 1
    ins = operands("LSTM", direction, lens=lens, peepholes=variant != "plain")
    assert_all_close(lumc_run("LSTM", ins, **attrs), ort_run("LSTM", ins, **attrs))


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("lens", [None, [1, 5, 3]])
def test_gru_matches_onnxruntime(direction, linear_before_reset, lens):
    attrs = {"direction": direction, "linear_before_reset": linear_before_reset}
    ins = operands("GRU", direction, lens=lens)
    assert_all_close(lumc_run("GRU", ins, **attrs), ort_run("GRU", ins, **attrs))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_rnn_matches_onnxruntime(direction):
    ins = operands("RNN", direction, lens=[4, 5, 1])
    assert_all_close(lumc_run("RNN", ins, direction=direction),
                     ort_run("RNN", ins, direction=direction))


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["LeakyRelu", "ScaledTanh"], [0.2, 0.7], [1.3]),
    ("RNN", ["Affine", "Elu"], [0.5, 0.9], [0.1]),
    ("RNN", ["HardSigmoid", "Softsign"], [0.3], [0.4]),
    ("RNN", ["Relu", "Softplus"], None, None),
    ("RNN", ["ThresholdedRelu", "LeakyRelu"], [0.1], None),
    ("GRU", ["HardSigmoid", "Softsign", "Sigmoid", "Relu"], None, None),   # default alphas
    ("LSTM", ["HardSigmoid", "Elu", "Softsign", "Sigmoid", "Tanh", "ScaledTanh"],
     [0.25, 0.6, 0.9], [0.45, 1.1]),
])
def test_custom_activations_match_onnxruntime(op, acts, alpha, beta):
    attrs = {"direction": "bidirectional", "activations": acts}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    ins = operands(op, "bidirectional")
    assert_all_close(lumc_run(op, ins, **attrs), ort_run(op, ins, **attrs))


def test_activation_names_are_case_insensitive():
    ins = operands("GRU", "forward")
    got = lumc_run("GRU", ins, activations=["hardsigmoid", "TANH"])
    assert_all_close(got, ort_run("GRU", ins, activations=["HardSigmoid", "Tanh"]))


def test_defaults_without_optional_inputs():
    ins = [(k, a if k in ("X", "W", "R") else None) for k, a in operands("LSTM", "forward")]
    assert_all_close(lumc_run("LSTM", ins), ort_run("LSTM", ins))
    ins = [(k, a if k in ("X", "W", "R") else None) for k, a in operands("GRU", "reverse")]
    assert_all_close(lumc_run("GRU", ins, direction="reverse"),
                     ort_run("GRU", ins, direction="reverse"))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1_matches_onnx_reference_evaluator(op, direction):
    attrs = {"direction": direction, "layout": 1}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    ins = operands(op, direction, layout=1, peepholes=True)
    want = ReferenceEvaluator(onnx_model(op, ins, **attrs)).run(
        None, {k: a for k, a in ins if a is not None})
    got = lumc_run(op, ins, **attrs)
    assert got[0].shape == (BATCH, SEQ, 2 if direction == "bidirectional" else 1, HID)
    assert_all_close(got, want)


def _torch_lstm_weights(lstm_mod, bidirectional):
    """ONNX W, R, B from torch.nn.LSTM (torch gate order i f g o, ONNX i o f c)."""
    order = [0, 3, 1, 2]

    def reorder(t):
        blocks = np.split(t.detach().numpy(), 4)
        return np.concatenate([blocks[i] for i in order])
    ws, rs, bs = [], [], []
    for sfx in ([""] + (["_reverse"] if bidirectional else [])):
        ws.append(reorder(getattr(lstm_mod, "weight_ih_l0" + sfx)))
        rs.append(reorder(getattr(lstm_mod, "weight_hh_l0" + sfx)))
        bs.append(np.concatenate([reorder(getattr(lstm_mod, "bias_ih_l0" + sfx)),
                                  reorder(getattr(lstm_mod, "bias_hh_l0" + sfx))]))
    return np.stack(ws), np.stack(rs), np.stack(bs)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_matches_torch(bidirectional):
    torch.manual_seed(0)
    mod = torch.nn.LSTM(INP, HID, bidirectional=bidirectional)
    x = randn(SEQ, BATCH, INP)
    d = 2 if bidirectional else 1
    h0, c0 = randn(d, BATCH, HID), randn(d, BATCH, HID)
    with torch.no_grad():
        y, (hn, cn) = mod(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    w, r, b = _torch_lstm_weights(mod, bidirectional)
    ins = [("X", x), ("W", w), ("R", r), ("B", b), ("sequence_lens", None), ("initial_h", h0),
           ("initial_c", c0), ("P", None)]
    got = lumc_run("LSTM", ins, direction="bidirectional" if bidirectional else "forward")
    # torch Y is [seq, batch, dirs * hidden]; ONNX Y is [seq, dirs, batch, hidden]
    want_y = y.numpy().reshape(SEQ, BATCH, d, HID).transpose(0, 2, 1, 3)
    assert_all_close(got, [want_y, hn.numpy(), cn.numpy()])


def test_gru_matches_torch():
    torch.manual_seed(1)
    mod = torch.nn.GRU(INP, HID, bidirectional=True)
    x = randn(SEQ, BATCH, INP)
    h0 = randn(2, BATCH, HID)
    with torch.no_grad():
        y, hn = mod(torch.from_numpy(x), torch.from_numpy(h0))
    order = [1, 0, 2]            # torch r z n -> ONNX z r h

    def reorder(t):
        return np.concatenate([np.split(t.detach().numpy(), 3)[i] for i in order])
    w = np.stack([reorder(getattr(mod, "weight_ih_l0" + s)) for s in ("", "_reverse")])
    r = np.stack([reorder(getattr(mod, "weight_hh_l0" + s)) for s in ("", "_reverse")])
    b = np.stack([np.concatenate([reorder(getattr(mod, "bias_ih_l0" + s)),
                                  reorder(getattr(mod, "bias_hh_l0" + s))]) for s in ("", "_reverse")])
    ins = [("X", x), ("W", w), ("R", r), ("B", b), ("sequence_lens", None), ("initial_h", h0)]
    got = lumc_run("GRU", ins, direction="bidirectional", linear_before_reset=1)
    want_y = y.numpy().reshape(SEQ, BATCH, 2, HID).transpose(0, 2, 1, 3)
    assert_all_close(got, [want_y, hn.numpy()])


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_f16_via_cast(op):
    ins = operands(op, "bidirectional")
    ins16 = [(k, a.astype(np.float16).astype(np.float32) if a is not None else None) for k, a in ins]
    want = [w.astype(np.float16) for w in ort_run(op, ins16, direction="bidirectional")]
    got = lumc_run(op, ins, compute=dt.f16, direction="bidirectional")
    assert all(g.dtype == np.float16 for g in got)
    assert_all_close(got, want, atol=ATOL["f16"])


def test_errors_name_the_op():
    ins = operands("LSTM", "forward")
    with pytest.raises(ModelError, match="LSTM"):
        lumc_run("LSTM", ins, direction="sideways")
    with pytest.raises(ModelError, match="activation"):
        lumc_run("LSTM", ins, activations=["Sigmoid", "Gelu", "Tanh"])
    with pytest.raises(ModelError):
        lumc_run("LSTM", ins, activations=["Sigmoid"])
    bad = [(k, a[:, :-1] if k == "W" else a) for k, a in ins]
    with pytest.raises(ShapeError, match="W must be"):
        lumc_run("LSTM", bad)
    bad = [(k, np.array([1, 2], np.int32) if k == "sequence_lens" else a) for k, a in ins]
    with pytest.raises(ShapeError, match="sequence_lens"):
        lumc_run("LSTM", bad)
