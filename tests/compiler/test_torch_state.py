"""State and gradients through ``torch.compile(backend="lumc")``.

A graph that writes its inputs in place (a buffer's running average, a KV cache row set by index)
was compiled as if the writes were not there: the first call's outputs were right, the buffers
never changed, and later calls drifted from eager. The writes are now extra outputs of the pure
compiled graph, copied back into the inputs after each call. A graph whose inputs require
gradients returns outputs whose backward raises (lumc compiles for inference), instead of
outputs that silently cut the parameters off the loss.
"""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn

import lumc
from lumc.ir.errors import UnsupportedOpError


class Stateful(nn.Module):
    """A running mean of the inputs (``mul_`` / ``add_`` on a buffer) and a cache row written at a
    Python-int position."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.zeros(4))
        self.register_buffer("cache", torch.zeros(8, 4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x, pos: int):
        self.ema.mul_(0.9).add_(0.1 * x.mean(0))
        self.cache[pos] = x[0]
        return self.lin(x) + self.ema, self.cache.sum(0)


@pytest.mark.parametrize("search", [False, True])
def test_in_place_writes_to_buffers_are_kept_across_calls(search, tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m, ref = Stateful().eval(), Stateful().eval()
    ref.load_state_dict(m.state_dict())
    f = torch.compile(m, backend="lumc", options={"budget": "30s", "search": search,
                                                  "device": "sim:h200"})
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(3, 4)
            got, want = f(x, i), ref(x, i)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(m.ema, ref.ema, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(m.cache, ref.cache, rtol=0, atol=0)
    assert m.cache[:3].abs().sum() > 0          # the rows were really written


def test_a_graph_needing_gradients_refuses_its_backward(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = nn.Linear(8, 4)                          # train mode, parameters require grad
    bias = nn.Parameter(torch.zeros(4))
    f = torch.compile(m, backend="lumc", options={"budget": "10s", "search": False})
    x = torch.randn(2, 8)
    y = f(x)
    torch.testing.assert_close(y, m(x), rtol=1e-5, atol=1e-6)     # inference works as before
    loss = (y + bias).pow(2).sum()
    with pytest.raises(RuntimeError, match="compiled for inference"):
        loss.backward()
    with torch.no_grad():                        # no gradient needed: plain tensors
        assert not f(x).requires_grad


def test_lumc_compile_names_the_way_out_for_state_written_in_forward():
    m = Stateful().eval()
    with pytest.raises(UnsupportedOpError, match="pass the state in and return its new value"):
        lumc.compile(m, budget="10s", example_inputs=(torch.randn(3, 4), 0))


class IndexedWrite(nn.Module):
    """A cache row written at an index held in a 0-d tensor: torch reads its value to index."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 8, 4))

    def forward(self, x, idx):
        self.cache[:, idx] = x
        return self.cache.sum(1)


def test_an_index_read_from_a_tensor_is_one_clear_error(capsys):
    from lumc.ir.errors import ModelError
    with pytest.raises(ModelError, match="uses a tensor's value as an index"):
        lumc.compile(IndexedWrite(), budget="10s", example_inputs=(torch.randn(1, 4),
                                                                   torch.tensor(0)))
    assert "def forward" not in capsys.readouterr().out     # torch's partial graph held back
    f = torch.compile(IndexedWrite(), backend="lumc", options={"budget": "10s", "search": False})
    with pytest.raises(Exception, match="uses a tensor's value as an index") as info:
        with torch.no_grad():
            f(torch.randn(1, 4), torch.tensor(1))
    assert "UnsupportedOpError" in str(info.value)
    assert "def forward" not in capsys.readouterr().out


def test_training_mode_batch_norm_says_so_on_both_paths():
    m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    with pytest.raises(UnsupportedOpError, match=r"batch norm in training mode \(call "
                                                 r"module.eval\(\) before compiling\)"):
        lumc.compile(m, budget="10s", example_inputs=(torch.randn(16, 8),))


def _change_weight(m):
    with torch.no_grad():
        m[0].weight.mul_(2)


_KEPT = []


def _replace_keeping_the_old(m):
    """A new weight whose old one stays alive elsewhere (its storage and version unchanged)."""
    _KEPT.append(m[0].weight)
    m[0].weight = nn.Parameter(m[0].weight.detach() * 2)


def _fused_adam_step(m, params=None):
    """A fused optimizer step writes the parameters without bumping their version counters."""
    opt = torch.optim.Adam(params or m.parameters(), lr=0.1, fused=True)
    for p in params or m.parameters():
        p.grad = torch.ones_like(p)
    opt.step()


def _step_another_module():
    _fused_adam_step(None, list(nn.Linear(2, 2).parameters()))


def test_torch_compile_outputs_need_a_gradient_where_eager_s_do(tmp_path, monkeypatch):
    """Through torch.compile, every output of a graph with an input needing gradients required
    them: ``y * 2`` of a y that needs none too (eager: not), so its ``.numpy()`` failed. Each
    output requires them where eager's does now (Dynamo's fake values say so)."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()

    def fn(x, y):
        return x * 2, x > 0, y * 2, x.argmax()
    f = torch.compile(fn, backend="lumc", options={"budget": "10s", "search": False})
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    got, want = f(x, y), fn(x, y)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
    torch.testing.assert_close(got[2].numpy(), want[2].numpy())
    with pytest.raises(RuntimeError, match="compiled for inference"):
        got[0].sum().backward()
    torch._dynamo.reset()


@pytest.mark.parametrize("change, what", [
    (_change_weight, "parameter '0.weight'"),
    (lambda m: m.load_state_dict({k: v + 1 for k, v in m.state_dict().items()}),
     "parameter '0.weight'"),
    (lambda m: setattr(m[0], "bias", nn.Parameter(torch.zeros(4))), "parameter '0.bias'"),
    (lambda m: m.half(), "parameter '0.weight'"),
    (_replace_keeping_the_old, "parameter '0.weight'"),
    (lambda m: m.train(), "its training flag"),
    (_fused_adam_step, "parameter '0.weight'"),
    (lambda m: setattr(m[0], "bias", None), "its set of parameters and buffers"),
    (lambda m: m.__setitem__(1, nn.Tanh().eval()), "submodule '1': Dropout -> Tanh"),
])
@pytest.mark.parametrize("how", ["reference", "range"])
def test_lumc_compile_refuses_a_call_after_the_module_changed(change, what, how, tmp_path,
                                                              monkeypatch):
    """``lumc.compile`` copies the weights into the plan; a weight changed in place after it (an
    optimizer step, ``load_state_dict``), replaced, converted or the module put in training mode
    left the compiled callable computing the old module, silently (``w.mul_(2)``: max error 0.94
    against eager). A call now says so in one line. So does a fused optimizer step (no version
    counter moves), a parameter set to None (no registration hook runs) and a parameterless
    submodule replaced by another class; an optimizer step of another module changes nothing."""
    from lumc.compiler.core.torch_compile import compile_module
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).eval()
    x = torch.randn(3, 4)
    if how == "range":
        f = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,),
                         dynamic_shapes=({0: torch.export.Dim("b", max=8)},))
    else:
        f = compile_module(m, (x,), search=False)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    m.double().float()                             # touched, not changed: still runs
    m.load_state_dict(m.state_dict())
    nn.Linear(2, 2)                                # a module made elsewhere: still runs
    _step_another_module()                         # another module's optimizer step: runs
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
        torch.testing.assert_close(f(x), m(x))
    change(m)
    with pytest.raises(lumc.InputError, match=f"module changed after lumc.compile copied it "
                                              f"\\({what}\\)") as e:
        f(x)
    assert "\n" not in str(e.value)


def test_lumc_compile_holds_no_module_it_needs(tmp_path, monkeypatch):
    """The watch is a weak reference: the compiled callable still runs once the module is gone."""
    import gc
    from lumc.compiler.core.torch_compile import compile_module
    m = nn.Linear(4, 4).eval()
    x = torch.randn(3, 4)
    f = compile_module(m, (x,), search=False)
    with torch.no_grad():
        want = m(x)
    del m
    gc.collect()
    torch.testing.assert_close(f(x), want)


def _aliasing(x, y):
    x.add_(1)
    z = y.view(-1)
    z.mul_(2)
    return x.relu_(), z, x.t(), x[1:], x * 1, y.reshape(-1)[2:]


@pytest.mark.parametrize("dynamic", [False, True])
def test_outputs_that_are_inputs_or_views_of_them_alias_them_as_in_eager(dynamic, tmp_path,
                                                                        monkeypatch):
    """An output that is an input (``x.relu_()``) or a view of one (``x.t()``, ``x[1:]``,
    ``y.view(-1)``) came back from torch.compile as a fresh copy: a write through it no longer
    reached the input (eager: ``x.t().fill_(7)`` sets x). Such outputs are the input itself or
    a view of it with eager's sizes, strides and offset now."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    f = torch.compile(_aliasing, backend="lumc", dynamic=dynamic,
                      options={"budget": "10s", "device": "sim:h200"})
    for shape in ((3, 2), (4, 3)):
        x, y = torch.randn(shape), torch.randn(shape[::-1])
        ours, theirs = [x.clone(), y.clone()], [x.clone(), y.clone()]
        with torch.no_grad():
            got, want = f(*ours), _aliasing(*theirs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
            assert [g.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
                    for a in ours] == [w.untyped_storage().data_ptr() ==
                                       a.untyped_storage().data_ptr() for a in theirs]
        assert got[0] is ours[0]
        got[2].fill_(7)
        want[2].fill_(7)
        torch.testing.assert_close(ours, theirs)
    torch._dynamo.reset()


def test_an_input_written_in_place_that_overlaps_another_is_refused(tmp_path, monkeypatch):
    """``f(base[:3], base[1:])`` with ``x.add_(1); return x + y``: eager's y sees the write
    through the shared memory, the compiled graph read y as it was (max error 1.0). Refused in
    one line naming both inputs; disjoint views of one tensor still run."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()

    def fn(x, y):
        x.add_(1)
        return x + y
    f = torch.compile(fn, backend="lumc", options={"budget": "10s", "search": False})
    base, ref = torch.zeros(6), torch.zeros(6)
    with torch.no_grad():
        torch.testing.assert_close(f(base[:3], base[3:]), fn(ref[:3], ref[3:]))
        torch.testing.assert_close(base, ref)
        with pytest.raises(Exception, match="inputs 'L_x_' and 'L_y_' share memory and the "
                                            "graph writes 'L_x_' in place"):
            f(base[:3], base[1:4])
    torch._dynamo.reset()


def test_lumc_compile_outputs_need_the_gradient_their_inputs_need(tmp_path, monkeypatch):
    """``lumc.compile``'s callable returned detached outputs for inputs that require gradients:
    a loss through them (``f(x)[0].sum() + other(x)``) ran its backward and silently left x
    without their share. The outputs that read such an input now require gradients as eager's
    do, and their backward raises; the others, and calls under no_grad, stay plain."""
    from lumc.compiler.core.torch_compile import compile_module
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x, y):
            # detached ones never need one (decomposed, a detach was an alias: True, True)
            return self.lin(x), x > 0, y * 2, self.lin(x).detach(), x.detach() + 1
    m = Two().eval()
    x, y = torch.randn(2, 4), torch.randn(3)
    for f in (compile_module(m, (x, y), search=False),
              lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x, y)),
              lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x, y))):
        xr = x.clone().requires_grad_()
        got, want = f(xr, y), m(xr, y)
        assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == \
            [True, False, False, False, False]
        for g, w in zip(got, want):
            torch.testing.assert_close(g.detach(), w.detach())
        with pytest.raises(RuntimeError, match="compiled for inference and has no backward"):
            (got[0].sum() + xr.sum()).backward()
        with torch.no_grad():
            assert not any(t.requires_grad for t in f(xr, y))
    assert f.reused


def test_every_plan_callable_refuses_a_backward_instead_of_detaching(tmp_path, monkeypatch):
    """The ONNX path (``lumc.compile(path)``), a loaded artifact and a torch module's size range
    returned outputs with ``requires_grad=False`` for an input that requires gradients, so a loss
    through them silently gave that input no gradient from them. Each now follows eager: a float
    output that reads the input requires gradients and its backward raises; an integer output,
    an output that reads no such input, and a call under no_grad stay plain."""
    import onnx
    from onnx import TensorProto, helper
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("ArgMax", ["x"], ["c"]),
         helper.make_node("Neg", ["z"], ["n"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("c", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("n", TensorProto.FLOAT, [3])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    f = lumc.compile(str(path), budget="10s", device="sim:h200")
    f.save(tmp_path / "m.lumc")
    x, z = torch.tensor([1.0, -3.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0, 3.0])
    for h in (f, lumc.load(tmp_path / "m.lumc")):
        y, c, n = h(x, z)
        assert (y.requires_grad, c.requires_grad, n.requires_grad) == (True, False, False)
        torch.testing.assert_close(y.detach(), torch.tensor([2.0, -6.0, 4.0]))
        assert c.tolist() == [2] and n.tolist() == [-1.0, -2.0, -3.0]
        with pytest.raises(RuntimeError, match="compiled for inference and has no backward"):
            y.sum().backward()
        with torch.no_grad():
            assert not any(t.requires_grad for t in h(x, z))

    class Row(nn.Module):
        def forward(self, a):
            return a * 2, a.sum(-1), (a > 0).sum(-1)
    r = lumc.compile(Row(), budget="10s", device="sim:h200", example_inputs=(torch.randn(2, 8),),
                     dynamic_shapes=({1: torch.export.Dim("n", min=2, max=64)},))
    a = torch.randn(2, 21, requires_grad=True)
    got, want = r(a), Row()(a)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [True, True, False]
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_.detach(), w.detach())
    with pytest.raises(RuntimeError, match="compiled for inference and has no backward"):
        got[1].sum().backward()


def test_the_watch_keeps_neither_the_module_nor_its_weights_alive():
    """The fast check holds the module's tensors and submodules (read back with ``map``: half
    the per-call time of a loop over weak references), only while the module lives: a compiled
    callable kept after its module is deleted must not keep the module's weights in memory."""
    import gc
    import weakref
    from lumc.compiler.core.torch_state import ModuleWatch
    m = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2))).eval()
    w = ModuleWatch(m)
    w.check()
    m[1][1].train()                      # a nested submodule's flag: seen by the fast check
    with pytest.raises(Exception, match=r"training flag of submodule '1\.1'"):
        w.check()
    m[1][1].eval()
    w.check()
    gone = weakref.ref(m), weakref.ref(m[1][1].weight)
    del m
    gc.collect()
    assert gone[0]() is None and gone[1]() is None
    w.check()                            # nothing left to compare: no error


class _Scaled(nn.Module):
    causal = False                                # a class attribute forward reads

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 2.0
        self.eps = 1e-5
        self.offsets = [0.5, -1.0]                # a list, changed in place below
        self.cfg = types.SimpleNamespace(act="relu", nan=float("nan"))   # a config object

    def forward(self, x):
        y = self.lin(x) * self.scale + self.eps + self.offsets[1]
        y = torch.relu(y) if self.cfg.act == "relu" else torch.tanh(y)
        return y.tril() if self.causal else y


def _set(obj, name, value):
    return lambda m: setattr(obj(m), name, value)


@pytest.mark.parametrize("change, what", [
    (_set(lambda m: m, "scale", 3.0), "attribute 'scale' of the module: 2.0 -> 3.0"),
    (_set(lambda m: m, "scale", 2), "attribute 'scale' of the module: 2.0 -> 2"),
    (_set(lambda m: m, "eps", 0.5), "attribute 'eps' of the module: 1e-05 -> 0.5"),
    (lambda m: m.offsets.append(9.0), "'offsets' of the module: [0.5, -1.0] -> [0.5, -1.0, 9.0]"),
    (lambda m: m.offsets.__setitem__(1, 4.0), "'offsets' of the module: [0.5, -1.0] -> [0.5, 4.0]"),
    (_set(lambda m: m.cfg, "act", "tanh"), "attribute 'cfg.act' of the module: 'relu' -> 'tanh'"),
    (_set(lambda m: m, "causal", True), "attribute 'causal' of the module: set to True"),
    (_set(lambda m: m.lin, "in_features", 5), "attribute 'in_features' of submodule 'lin'"),
])
def test_lumc_compile_refuses_a_call_after_a_plain_attribute_changed(change, what, tmp_path,
                                                                      monkeypatch):
    """``self.scale = 2.0`` read by forward is baked into the traced graph: after
    ``m.scale = 3.0`` the compiled callable went on computing ``x * 2.0`` without a word (the
    watch compared only tensors and training flags). A call now says what changed; a compile
    after the change computes the new value (the stored plan of the old one is not reused), and
    one back at the old value reuses its plan."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = _Scaled().eval()
    x = torch.randn(3, 4)
    f = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,))
    with torch.no_grad():
        want = m(x)
        torch.testing.assert_close(f(x), want)
        m.note = "not read by forward"             # a new attribute forward never saw: runs
        torch.testing.assert_close(f(x), want)
        change(m)
        changed = m(x)
        # the same values after these (a wrong result is what the others would give)
        same = ("2.0 -> 2", "9.0]", "in_features")
        assert torch.allclose(changed, want) == any(w in what for w in same)
        with pytest.raises(lumc.InputError, match="module changed after lumc.compile copied it") \
                as e:
            f(x)
        assert what in str(e.value) and "\n" not in str(e.value)
        if "in_features" in what:
            return
        g = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,))
        assert g.reused is None
        torch.testing.assert_close(g(x), changed)


def test_the_attribute_watch_takes_the_stored_plan_path_too(tmp_path, monkeypatch):
    """A compile that reuses a stored plan watches the attributes as a fresh one does."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m = _Scaled().eval()
    x = torch.randn(3, 4)
    lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,))
    g = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,))
    assert g.reused is not None
    with torch.no_grad():
        torch.testing.assert_close(g(x), m(x))
        m.scale = -1.0
        with pytest.raises(lumc.InputError, match="attribute 'scale' of the module: 2.0 -> -1.0"):
            g(x)
        m.scale = 2.0                              # back as compiled: runs again
        torch.testing.assert_close(g(x), m(x))


def test_a_submodule_replaced_by_another_class_is_refused(tmp_path, monkeypatch):
    """``m[1] = nn.Sigmoid()`` in place of an ``nn.Tanh()``: no tensor, flag or attribute
    differs, and the compiled callable went on computing tanh silently."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).eval()
    x = torch.randn(3, 4)
    f = lumc.compile(m, budget="10s", device="sim:h200", example_inputs=(x,))
    m[1] = nn.Sigmoid().eval()
    with torch.no_grad():
        assert not torch.allclose(m(x), torch.tanh(m[0](x)))     # what the plan computes
    with pytest.raises(lumc.InputError, match=r"module changed after lumc.compile copied it "
                                              r"\(submodule '1': Tanh -> Sigmoid\)"):
        f(x)
