"""Stored plans for torch modules (``lumc.compiler.core.torch_plan_cache``): a recompile of the
same module reuses the plan without capturing or re-timing anything, returns the same outputs,
reports the numerics recorded when the plan was chosen; other weights or shapes compile afresh."""
import time
import types

import numpy as np
import pytest
import torch

from lumc.compiler.core.torch_compile import compile_module
from lumc.compiler.core import torch_compile as compiled_mod


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.k = torch.nn.Linear(16, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.ln(x + torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), -1) @ x)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_recompile_reuses_the_stored_plan(cache, monkeypatch):
    torch.manual_seed(0)
    m = _Block().eval()
    x = torch.randn(2, 5, 16)
    f = compile_module(m, (x,), budget="20s", device="sim:h200")
    assert f.reused is None
    first = f.specializations[0].compiled.report_dict()
    assert first["max_rel_error"] is not None
    assert list(cache.glob("plans/*.torch"))

    def no_capture(*a, **k):
        raise AssertionError("a reused plan captured the module again")
    monkeypatch.setattr(compiled_mod, "capture_module", no_capture)
    t0 = time.perf_counter()
    g = compile_module(m, (x,), budget="20s", device="sim:h200")
    took = time.perf_counter() - t0
    assert g.reused and took < 5.0
    rep = g.specializations[0].compiled.report_dict()
    assert rep["max_rel_error"] == first["max_rel_error"]   # recorded, not re-checked as 0.0
    assert rep["measured"] == 0 and "reused" in rep["stopped_because"]
    with torch.no_grad():
        want = m(x)
    got = g(x)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
    assert "reused the stored plan" in g.report()
    # a static-shape plan refuses another shape in one line, as the captured one does
    with pytest.raises(Exception, match="expects|dim"):
        g(torch.randn(2, 6, 16))


def test_other_weights_or_shapes_compile_afresh(cache):
    torch.manual_seed(0)
    m = _Block().eval()
    x = torch.randn(2, 5, 16)
    compile_module(m, (x,), budget="20s", device="sim:h200")
    with torch.no_grad():
        m.q.weight.add_(1e-3)
    assert compile_module(m, (x,), budget="20s", device="sim:h200").reused is None
    assert compile_module(m, (torch.randn(2, 7, 16),), budget="20s",
                          device="sim:h200").reused is None
    assert len(list(cache.glob("plans/*.torch"))) == 3


def test_a_pickle_in_the_plan_cache_is_never_unpickled(tmp_path):
    """The stored capture interface is JSON: a pickle planted under a plan's key (which would run
    code when unpickled) is refused as unreadable data and the plan is recompiled."""
    import pickle
    from lumc.compiler.core import torch_plan_cache as plan_cache
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    (tmp_path / "k.lumc").write_bytes(b"")
    (tmp_path / "k.torch").write_bytes(pickle.dumps(Payload()))
    assert plan_cache.load_shell(tmp_path, "k") is None
    assert not marker.exists()


class _TwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return {"y": y, "t": torch.tanh(y)}


@pytest.mark.parametrize("resign", [False, True])
def test_a_stored_interface_edited_into_other_valid_json_is_not_believed(cache, resign):
    """The stored interface (``.torch``) is JSON beside the plan; a copy damaged or edited into
    other valid JSON was believed: with an output renamed, the reused module returned None for it,
    with an input's dtype changed it refused the right tensor, with another shape key it raised
    an AttributeError. Now the file carries its digest, and a pair whose interface does not match
    the plan's inputs and outputs (even under a valid digest) is recompiled and overwritten."""
    import hashlib
    import json
    torch.manual_seed(0)
    m = _TwoOut().eval()
    x = torch.randn(2, 4)
    compile_module(m, (x,), budget="10s", device="sim:h200")
    (path,) = cache.glob("plans/*.torch")
    good = path.read_bytes()
    with torch.no_grad():
        want = m(x)
    for edit in (lambda s: s.update(output_names=["zz", "t"]),
                 lambda s: s["inputs"][0].update(dtype="f16"),
                 lambda s: s.update(key=[[[9, 4], "float32"]])):
        doc = json.loads(good)
        edit(doc.get("shell", doc))
        if resign and "shell" in doc:
            doc["sha256"] = hashlib.sha256(json.dumps(doc["shell"], sort_keys=True)
                                           .encode()).hexdigest()
        path.write_text(json.dumps(doc))
        g = compile_module(m, (x,), budget="10s", device="sim:h200")
        assert g.reused is None
        got = g(x)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
        assert json.loads(path.read_bytes())["shell"]["output_names"] == ["y", "t"]   # rewritten
    assert compile_module(m, (x,), budget="10s", device="sim:h200").reused


def test_the_default_dtype_is_part_of_the_key(cache):
    """``torch.ones(3)`` in forward follows torch's default dtype; a recompile after
    ``torch.set_default_dtype(torch.float64)`` reused the float32 plan (float32 outputs where
    eager gives float64)."""
    class Consts(torch.nn.Module):
        def forward(self, x):
            return torch.ones(3) * x.sum() + torch.arange(3) / 3
    x = torch.randn(4)
    f = compile_module(Consts(), (x,), budget="10s", device="sim:h200")
    assert f(x).dtype == torch.float32
    try:
        torch.set_default_dtype(torch.float64)
        g = compile_module(Consts(), (x,), budget="10s", device="sim:h200")
        want = Consts()(x)
        assert g.reused is None and want.dtype == torch.float64
        torch.testing.assert_close(g(x), want)
    finally:
        torch.set_default_dtype(torch.float32)


def test_the_devices_are_part_of_the_key():
    """A reused plan returns its outputs on the device stored with it; the key did not see the
    inputs', the weights' or torch's default device, so a module compiled on the CPU and again
    on a GPU would have reused the CPU plan and returned CPU tensors. (The meta device stands in
    for a GPU: the key reads no input data; the weights' device is keyed the same way, untested
    without a GPU.)"""
    from lumc.compiler.core import torch_plan_cache as plan_cache
    m = torch.nn.Linear(4, 3)

    def key(x):
        return plan_cache.module_key(m, (x,), {}, None, "sim:h200", {})
    assert key(torch.randn(2, 4)) == key(torch.randn(2, 4))
    assert key(torch.randn(2, 4)) != key(torch.empty(2, 4, device="meta"))
    x = torch.randn(2, 4)
    before = key(x)
    with torch.device("meta"):        # torch.ones(3) in forward would be made there
        assert key(x) != before


class _Gated(torch.nn.Module):
    """What forward computes depends on plain attributes: a flag, a stored function, a config."""

    def __init__(self, causal: bool, act=torch.tanh, cfg=None):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.causal, self.act = causal, act
        self.cfg = cfg if cfg is not None else _Cfg()

    def forward(self, x):
        s = self.proj(x) @ x.transpose(-1, -2)
        if self.causal:
            t = s.shape[-1]
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        return self.act(torch.softmax(s * self.cfg.scale, -1) @ x)


class _Cfg:
    def __init__(self, scale=0.25):
        self.scale = scale


def test_plain_attributes_are_part_of_the_key(cache):
    """Two modules with the same class, weights and ``repr`` whose plain attributes differ (a
    causal flag, the activation stored as an attribute, a config object's field, train/eval)
    compute different things: neither may reuse the other's plan (it did for the flag and the
    config, and returned the other module's results)."""
    x = torch.randn(2, 6, 16)
    variants = [dict(causal=False), dict(causal=True), dict(causal=False, act=torch.sigmoid),
                dict(causal=False, cfg=_Cfg(0.5))]
    for kw in variants:
        torch.manual_seed(0)
        m = _Gated(**kw).eval()
        f = compile_module(m, (x,), budget="20s", device="sim:h200")
        assert f.reused is None, kw
        with torch.no_grad():
            want = m(x)
        torch.testing.assert_close(f(x), want, rtol=1e-4, atol=1e-5)
    torch.manual_seed(0)
    m = _Gated(causal=True)
    assert m.training and compile_module(m, (x,), budget="20s", device="sim:h200").reused is None
    # and the same module again does reuse
    assert compile_module(m, (x,), budget="20s", device="sim:h200").reused


def test_fingerprint_sees_configs_and_closures():
    from lumc.compiler.core.torch_plan_cache import module_fingerprint
    torch.manual_seed(0)
    m = _Gated(False)
    a = module_fingerprint(m)
    torch.manual_seed(0)
    assert module_fingerprint(_Gated(False)) == a           # not an address or an id
    m.cfg.scale = 0.3
    assert module_fingerprint(m) != a
    k = 2.0
    m.act = lambda t: t * k
    b = module_fingerprint(m)
    k = 3.0   # the closure's value is part of the function
    m.act = lambda t: t * k
    assert module_fingerprint(m) != b


_SCALE = 1.0   # a module-level global a forward reads


class _Helper:
    def __call__(self, t):
        return t * 2


_helpers = types.ModuleType("_lumc_test_helpers")   # a module of the user's, read as helpers.x
_helpers.__file__ = __file__
_helpers.factor = 1.0


def _shift(t, by=0.0):
    return t + by


class _Slots:
    __slots__ = ("scale",)

    def __init__(self, v):
        self.scale = v


class _Wide(torch.nn.Module):
    flip = False                      # a class attribute forward reads

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(4.0), persistent=False)
        self.side = [torch.nn.Linear(4, 4)]            # a module outside the tree
        self.helper = _Helper()
        self.deep = {"a": [{"b": {"c": [[{"d": {"e": {"f": {"g": False}}}}]]}}]}
        self.slots = _Slots(1.0)

    @property
    def gain(self):
        return 1.0

    def forward(self, x):
        y = self.helper(self.lin(x) + self.table + self.side[0](x)) * _SCALE
        y = _shift(y) * self.gain * self.slots.scale * _helpers.factor
        if self.deep["a"][0]["b"]["c"][0][0]["d"]["e"]["f"]["g"] in {"a", "b", "c", "d"}:
            y = y + 1
        return -y if type(self).flip or self.deep["a"][0]["b"]["c"][0][0]["d"]["e"]["f"]["g"] else y


@pytest.mark.parametrize("change", ["non-persistent buffer", "module in a list", "class attribute",
                                    "class forward", "helper's class", "deep flag", "global",
                                    "default argument", "property", "slots", "module attribute"])
def test_every_kind_of_state_forward_reads_changes_the_key(change):
    """Each of these once left the key unchanged, so a recompile returned the earlier plan's
    (now wrong) results."""
    global _SCALE
    from lumc.compiler.core.torch_plan_cache import module_fingerprint
    torch.manual_seed(0)
    m = _Wide()
    before = module_fingerprint(m)
    assert module_fingerprint(m) == before
    saved = (_Wide.forward, _Helper.__call__, _SCALE, _shift.__defaults__, _Wide.gain, _helpers.factor)
    try:
        if change == "non-persistent buffer":
            m.table.add_(1)
        elif change == "module in a list":
            with torch.no_grad():
                m.side[0].weight.mul_(2)
        elif change == "class attribute":
            _Wide.flip = True
        elif change == "class forward":
            _Wide.forward = lambda self, x: saved[0](self, x).relu()
        elif change == "helper's class":
            _Helper.__call__ = lambda self, t: t * 3
        elif change == "deep flag":
            m.deep["a"][0]["b"]["c"][0][0]["d"]["e"]["f"]["g"] = True
        elif change == "default argument":
            _shift.__defaults__ = (1.0,)
        elif change == "property":
            _Wide.gain = property(lambda self: 2.0)
        elif change == "slots":
            m.slots.scale = 3.0
        elif change == "module attribute":
            _helpers.factor = 2.0
        else:
            _SCALE = 2.0
        assert module_fingerprint(m) != before
    finally:
        _Wide.flip = False
        m.deep["a"][0]["b"]["c"][0][0]["d"]["e"]["f"]["g"] = False
        _Wide.forward, _Helper.__call__, _SCALE, _shift.__defaults__, _Wide.gain, _helpers.factor = saved
        m.slots.scale = 1.0
    assert module_fingerprint(m) == before or change in ("non-persistent buffer", "module in a list")


_FP_SCRIPT = """
import sys, torch, transformers
sys.path.insert(0, {tests!r})
from lumc.compiler.core import torch_plan_cache as pc
from test_torch_plan_reuse import _Wide
torch.manual_seed(0)
cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                              intermediate_size=64, vocab_size=50)
torch.manual_seed(0)
bert = transformers.BertModel(cfg).eval()
torch.manual_seed(0)
fp = pc._Fingerprint()
fp.module(bert)
print(fp.exhausted, pc.module_fingerprint(_Wide()) + pc.module_fingerprint(bert))
"""


def test_the_key_is_the_same_in_another_process():
    """A recompile in a new process reuses: nothing in the key depends on hash seeds (a set
    literal in forward) or addresses, and a transformers model's state is followed without
    wandering into the standard library (it once ran out of budget, so never reused)."""
    import subprocess
    import sys
    from pathlib import Path
    script = _FP_SCRIPT.format(tests=str(Path(__file__).parent))
    outs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env=dict(__import__("os").environ, PYTHONHASHSEED=str(seed))).stdout
            for seed in (1, 2)]
    assert outs[0] == outs[1] and outs[0].startswith("False ")


def test_a_state_too_large_to_follow_is_never_reused(monkeypatch):
    from lumc.compiler.core import torch_plan_cache as pc
    monkeypatch.setattr(pc, "_MAX_VALUES", 10)
    m = _Wide()
    assert pc.module_fingerprint(m) != pc.module_fingerprint(m)


_TYPED = """
import torch
class Div(torch.nn.Module):
    def forward(self, x):
        return x / {c}
"""


@pytest.mark.parametrize("where", ["<string>", "<stdin>"])
def test_code_with_no_file_is_part_of_the_key(cache, where):
    """A module class typed at a REPL (``<stdin>``) or run by ``python -c``/``exec``
    (``<string>``) has no source file: its code was keyed as a library's, by bytecode alone, and
    ``x / 3.0`` and ``x / 7.0`` are one bytecode. The second compile, in the same process or a
    later one, reused the first's plan and returned x / 3 for x / 7, silently."""
    x = torch.tensor([7.0, 1.0, 10.0, 5.0, 1e-3])
    for c in (3.0, 7.0):
        ns = {"__name__": "lumc_test_typed_here"}   # no module of that name: no file
        exec(compile(_TYPED.format(c=c), where, "exec"), ns)
        f = compile_module(ns["Div"]().eval(), (x,), budget="20s", device="sim:h200")
        assert f.reused is None, c
        np.testing.assert_array_equal(f(x).numpy(), (x.double() / c).float().numpy())


def test_a_reduced_precision_plan_is_keyed_by_the_example_values(cache):
    """bf16 with N(0, 1) examples passes the gate; examples e0 - e1 against two weight columns
    1e-4 apart do not. The key held the examples' shapes only, so the second compile reused the
    bf16 plan: 187% error on its own inputs, the report quoting the first inputs' 0.25%."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64, bias=False)
    with torch.no_grad():
        lin.weight[:, 1] = lin.weight[:, 0] + 1e-4 * torch.randn(64)
    m = torch.nn.Sequential(lin).eval()
    x = torch.zeros(4, 64)
    x[:, 0], x[:, 1] = 1.0, -1.0
    first = compile_module(m, (torch.randn(4, 64),), budget="20s", device="sim:h200",
                           precision="bf16")
    assert first.specializations[0].compiled.report_dict()["precision"] == "bf16"
    f = compile_module(m, (x,), budget="20s", device="sim:h200", precision="bf16")
    assert f.reused is None
    assert f.specializations[0].compiled.report_dict()["precision"] == "fp32"
    ref = x.double() @ lin.weight.double().T
    assert (f(x).double() - ref).abs().max() <= 1e-4 * ref.abs().max()
