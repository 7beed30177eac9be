"""A Dynamo graph's state, for ``torch_backend.DynamoGraph``: writes to its inputs made pure, and
outputs that refuse a backward; and for ``lumc.compile``'s callable, a watch on the module it
copied (:class:`ModuleWatch`).

lumc compiles pure functions for inference. A graph that writes its inputs in place (a buffer's
running mean, a KV cache row set by index) is functionalized by ``torch.func.functionalize``,
which ends it with ``copy_(input, new value)``; :func:`lift_input_writes` turns those into extra
outputs that the caller copies back after each call, as eager mode leaves the inputs. A graph
whose inputs require gradients runs through ``runtime.no_backward.InferenceOnly``, so ``loss.backward()`` through
its outputs fails in one line instead of silently giving its parameters no gradient. Outputs
that are inputs or views of them (``x.relu_()``, ``x.t()``) are returned as such, as eager does
(:func:`output_aliases`), and a write to an input that shares memory with another input is
refused (:func:`refuse_overlapping_writes`).
"""
from __future__ import annotations

import operator

import torch


def lift_input_writes(gm: torch.fx.GraphModule, arg_index: list[int]) -> list[tuple[int, str]]:
    """Turn the functionalized graph's in-place writes into its inputs (``copy_(input, new)`` at
    the end: a buffer updated in ``forward``, a KV cache row set by index) into extra outputs, last,
    so the compiled graph is a pure function; returns ``[(argument index, placeholder name)]`` in
    output order (``arg_index[k]``: the Dynamo argument of the k-th placeholder)."""
    places = [p for p in gm.graph.nodes if p.op == "placeholder"]
    out_node = next(p for p in reversed(gm.graph.nodes) if p.op == "output")
    writes, values = [], []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0] in places and not node.users:
            writes.append((arg_index[places.index(node.args[0])], node.args[0].name))
            values.append(node.args[1])
            gm.graph.erase_node(node)
    if writes:
        outs = out_node.args[0]
        out_node.args = ((tuple(outs) if isinstance(outs, (tuple, list)) else (outs,))
                         + tuple(values),)
        gm.recompile()
    return writes


def write_back(writes: list[tuple[int, str]], args, out: tuple) -> tuple:
    """A graph's own outputs; its last ones are the new values of the inputs it wrote in place
    (``writes``, from :func:`lift_input_writes`: a buffer's EMA, a KV cache row), copied into
    those arguments here, as eager mode leaves them."""
    if not writes:
        return out
    with torch.no_grad():
        for (i, _), v in zip(writes, out[len(out) - len(writes):]):
            args[i].copy_(v)
    return out[:len(out) - len(writes)]


def refuse_overlapping_writes(writes: list[tuple[int, str]], args, names: list[str]) -> None:
    """Refuse a call where an input the graph writes in place shares memory with another input
    (``f(base[:3], base[1:])`` writing the first): eager reads the other through the write, the
    compiled graph reads both as they were before the call.

    Raises:
        InputError: one line naming both inputs.
    """
    from lumc.ir.errors import InputError
    for i, _ in writes:
        a = args[i]
        if not isinstance(a, torch.Tensor) or a.numel() == 0:
            continue
        lo, hi = _extent(a)
        for j, b in enumerate(args):
            if j == i or not isinstance(b, torch.Tensor) or b.numel() == 0 or \
                    b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr():
                continue
            blo, bhi = _extent(b)
            if blo < hi and lo < bhi:
                raise InputError(f"inputs {names[i]!r} and {names[j]!r} share memory and the graph "
                                 f"writes {names[i]!r} in place: lumc compiles them as separate "
                                 "tensors, so the other would not see the write as in eager; "
                                 "pass a copy (.clone())", node=names[i])


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` of its storage a tensor can reach."""
    first = t.storage_offset()
    last = first + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0)
    low = first + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st < 0)
    return low * t.element_size(), (last + 1) * t.element_size()


def output_aliases(gm: torch.fx.GraphModule) -> list[tuple]:
    """The outputs of a Dynamo graph that are an input or a view of one (``x.relu_()``, ``x.t()``,
    ``x[1:]``, ``y.view(-1)``), as eager returns them: ``[(output position, argument index, sizes,
    strides, storage offset from the input's)]`` from the graph's fake values (sizes as SymInts
    where Dynamo made them symbolic). lumc's compiled graph returns fresh tensors; the caller makes
    these outputs views of the inputs again (:func:`restore_aliases`), so a write through one
    reaches the input as in eager."""
    from torch.multiprocessing.reductions import StorageWeakRef
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    owner = {}
    for i, p in enumerate(places):
        ev = p.meta.get("example_value")
        if isinstance(ev, torch.Tensor):
            owner.setdefault(StorageWeakRef(ev.untyped_storage()), i)
    found = []
    for k, o in enumerate(_graph_outputs(gm)):
        ev = o.meta.get("example_value") if isinstance(o, torch.fx.Node) else None
        if not isinstance(ev, torch.Tensor):
            continue
        i = owner.get(StorageWeakRef(ev.untyped_storage()))
        if i is not None:
            base = places[i].meta["example_value"]
            found.append((k, i, tuple(ev.shape), tuple(ev.stride()),
                          ev.storage_offset() - base.storage_offset()))
    return found


def restore_aliases(aliases: list[tuple], gm: torch.fx.GraphModule, args, out: tuple) -> tuple:
    """``out`` with each output of :func:`output_aliases` the input itself or a view of it (after
    the graph's writes are copied back, so it shows them); one whose sizes cannot be evaluated
    stays the compiled value."""
    env = _sizes(gm, args)
    out = list(out)
    for k, i, size, stride, offset in aliases:
        try:
            size, stride = [_int(d, env) for d in size], [_int(d, env) for d in stride]
            offset = _int(offset, env)
        except (TypeError, ValueError):
            continue
        a = args[i]
        if size == list(a.shape) and stride == list(a.stride()) and offset == 0:
            out[k] = a
        else:
            out[k] = a.as_strided(size, stride, a.storage_offset() + offset)
    return tuple(out)


def _sizes(gm: torch.fx.GraphModule, args) -> dict:
    """``{symbol: int}`` of a call: Dynamo's size symbols bound to the arguments' sizes."""
    env = {}
    for p, a in zip([n for n in gm.graph.nodes if n.op == "placeholder"], args):
        ev = p.meta.get("example_value")
        if isinstance(ev, torch.SymInt) and ev.node.expr.is_symbol:
            env[ev.node.expr] = int(a)
        elif isinstance(ev, torch.Tensor) and isinstance(a, torch.Tensor):
            for d, n in zip(ev.shape, a.shape):
                if isinstance(d, torch.SymInt) and d.node.expr.is_symbol:
                    env[d.node.expr] = int(n)
    return env


def _int(d, env: dict) -> int:
    if isinstance(d, torch.SymInt):
        return int(d.node.expr.xreplace(env))      # TypeError while a symbol is left
    return int(d)


def eager_requires_grad(gm: torch.fx.GraphModule) -> list[bool]:
    """Per output of a Dynamo graph, whether eager's requires gradients (Dynamo's fake values
    carry it; a graph is guarded on its inputs' ``requires_grad`` and the grad mode)."""
    return [bool(getattr(o.meta.get("example_value"), "requires_grad", True))
            if isinstance(o, torch.fx.Node) else False for o in _graph_outputs(gm)]


def _graph_outputs(gm: torch.fx.GraphModule) -> tuple:
    """The values an FX graph returns, in order (an output node's tuple, or its one value)."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = out_node.args[0]
    return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)


def _stamp(t: torch.Tensor) -> tuple:
    """What changes when a tensor's values may have: its in-place version (inference tensors keep
    none), storage, dtype and shape."""
    try:
        version = t._version
    except RuntimeError:
        version = None
    return id(t), version, t.data_ptr(), t.dtype, tuple(t.shape)


# parameters, buffers and submodules assigned to any module in this process (torch's global
# registration hooks, installed by the first ModuleWatch): a watch whose count is unchanged needs
# no walk of its module's tree to know that nothing was replaced
_REGISTRATIONS = [0]
# optimizer steps taken in this process (torch.optim's global step hook): a fused step
# (Adam(fused=True)) writes the parameters without bumping their version counters
_STEPS = [0]
_HOOKED = []


def _count_registrations() -> None:
    if _HOOKED:
        return
    from torch.nn.modules import module as nn_module

    def bump(*_):
        _REGISTRATIONS[0] += 1
    for name in ("register_module_parameter_registration_hook",
                 "register_module_buffer_registration_hook",
                 "register_module_module_registration_hook"):
        _HOOKED.append(getattr(nn_module, name)(bump))

    def stepped(*_):
        _STEPS[0] += 1
    from torch.optim import optimizer
    _HOOKED.append(optimizer.register_optimizer_step_post_hook(stepped))


_VERSION = operator.attrgetter("_version")
_DATA_PTR = operator.methodcaller("data_ptr")
_TRAINING = operator.attrgetter("training")


def _slots(module: torch.nn.Module) -> tuple[list[dict], list[str], list[torch.Tensor]]:
    """``(dicts, keys, tensors)``: the ``_parameters`` or ``_buffers`` dict and key each of the
    module's tensors sits in (those whose name leads to it: a module overriding
    ``named_parameters`` may name others)."""
    dicts, keys, tensors = [], [], []
    for attr, named in (("_parameters", module.named_parameters()),
                        ("_buffers", module.named_buffers())):
        for name, t in named:
            prefix, _, key = name.rpartition(".")
            try:
                d = getattr(module.get_submodule(prefix), attr)
            except AttributeError:
                continue
            if isinstance(d, dict) and d.get(key) is t:
                dicts.append(d)
                keys.append(key)
                tensors.append(t)
    return dicts, keys, tensors


class ModuleWatch:
    """What ``lumc.compile`` copied from a module, to tell a call that the module changed since.

    ``lumc.compile`` compiles the module's weights into its plan and keeps no reference to the
    module (only weak ones here): a weight written in place (``load_state_dict``, an optimizer
    step, ``w.mul_(2)``), replaced, set to None, converted (``.half()``), a submodule put in
    training mode or replaced by one of another class after the compile would leave the compiled
    callable computing the old module without a word. :meth:`check` raises instead, naming what
    changed. A call compares each parameter's and buffer's version counter and storage, that
    each still sits where it was (``m.bias = None`` and ``del`` call no registration hook), the
    number of each module's submodules and each one's training flag (some 60 us for BERT-base's
    199 tensors and 225 submodules on a CPU core); after a parameter, buffer or submodule was
    assigned anywhere (torch's global registration hooks count them) or where a stamp differs,
    the whole tree is compared by name, identity, class, dtype and shape, and a tensor whose
    stamp differs by its bytes (digest: a round trip through ``.double()`` and back changes
    nothing). After an optimizer step anywhere in the process (torch.optim's global step hook),
    every tensor is compared by its bytes, once: a fused step (``Adam(fused=True)``) leaves the
    version counters as they were. Not seen: a write through ``.data`` (``p.data -= lr *
    p.grad``), which moves no version counter and calls no hook. The plain Python attributes of
    the tree (``self.scale``, ``self.eps``, a config's values), which the trace baked into the
    graph, are compared with their compiled values too (``module_attrs.AttrWatch``). A module
    that is gone is not checked.

    Args:
        module: the module compiled.
        digests: ``{id(tensor): digest}`` already taken of its tensors
            (``torch_plan_cache.tensor_digest``, as the plan cache key takes them), not taken again.
    """

    def __init__(self, module: torch.nn.Module, digests: dict | None = None):
        import weakref
        from lumc.compiler.core.torch_plan_cache import tensor_digest
        _count_registrations()
        self._module = weakref.ref(module)
        digests = digests or {}
        self._tensors = {name: (_stamp(t), digests.get(id(t)) or tensor_digest(t))
                         for name, t in self._named(module)}
        self._flags = self._training(module)
        self._kinds = [(n, type(sub)) for n, sub in module.named_modules()]
        from lumc.compiler.core.module_attrs import AttrWatch
        self._attrs = AttrWatch(module)     # plain attributes forward may read (self.scale)
        self._snapshot(module)

    def _snapshot(self, module: torch.nn.Module) -> None:
        """The fast check's state: the module's tensors and submodules (held until the module is
        collected, never longer: ``weakref.finalize``), their version counters, data pointers and
        training flags, and the registration count (inference tensors keep no version counter:
        their data pointer alone). Read back with ``map`` over ``operator`` getters: some 50 us
        for BERT-base's 199 tensors and 225 submodules on a CPU core, where a Python loop over
        weak references took 100."""
        import weakref
        self._generation, self._steps = _REGISTRATIONS[0], _STEPS[0]
        tensors = [t for _, t in self._named(module)]
        plain = [t for t in tensors if not t.is_inference()]
        subs = list(module.modules())[1:]      # not the module itself: it is weakly held
        # where each tensor sits ({name: tensor} dict and key: ``m.bias = None`` and ``del``
        # call no registration hook) and how many submodules each module holds (``del seq[1]``)
        slots = _slots(module)
        trees = [m._modules for m in (module, *subs) if m._modules]
        if getattr(self, "_held", None) is None:
            self._held: list = []
            weakref.finalize(module, self._held.clear)
            weakref.finalize(module, self.__dict__.pop, "_attrs", None)   # it holds the dicts
        self._held[:] = [plain, tensors, subs, slots, trees]
        self._seen = (list(map(_VERSION, plain)), list(map(_DATA_PTR, tensors)),
                      list(map(_TRAINING, subs)), module.training, list(map(len, trees)))

    def _unchanged(self, module: torch.nn.Module) -> bool:
        if _REGISTRATIONS[0] != self._generation or _STEPS[0] != self._steps or not self._held:
            return False
        plain, tensors, subs, (dicts, keys, placed), trees = self._held
        versions, ptrs, flags, training, sizes = self._seen
        try:
            held = all(map(operator.is_, map(operator.getitem, dicts, keys), placed))
        except KeyError:                        # deleted
            return False
        return (held and module.training == training and list(map(_VERSION, plain)) == versions
                and list(map(_DATA_PTR, tensors)) == ptrs and list(map(_TRAINING, subs)) == flags
                and list(map(len, trees)) == sizes and self._attrs.unchanged())

    @staticmethod
    def _named(module: torch.nn.Module) -> list:
        return ([(f"parameter {n!r}", t) for n, t in module.named_parameters()]
                + [(f"buffer {n!r}", t) for n, t in module.named_buffers()])

    @staticmethod
    def _training(module: torch.nn.Module) -> list:
        return [(f"the training flag of submodule {n!r}" if n else "its training flag",
                 sub.training) for n, sub in module.named_modules()]

    def check(self) -> None:
        """Raises:
            InputError: the module's parameters, buffers, submodules' classes or training flags
                are not those compiled (one line naming the first that differs)."""
        module = self._module()
        if module is None or self._unchanged(module):
            return
        named = self._named(module)
        if len(named) != len(self._tensors):
            self._refuse("its set of parameters and buffers")
        stepped = _STEPS[0] != self._steps       # a fused step bumps no version counter
        for what, t in named:
            was = self._tensors.get(what)
            if was is None:
                self._refuse("its set of parameters and buffers")
            stamp = _stamp(t)
            if stamp != was[0] or stepped:
                from lumc.compiler.core.torch_plan_cache import tensor_digest
                if tensor_digest(t) != was[1]:
                    self._refuse(what)
                self._tensors[what] = (stamp, was[1])    # touched, not changed
        kinds = [(n, type(sub)) for n, sub in module.named_modules()]
        if kinds != self._kinds:             # Tanh replaced by Sigmoid: no tensor, no attribute
            self._refuse(next((f"submodule {a[0]!r}: {b[1].__name__} -> {a[1].__name__}"
                               for a, b in zip(kinds, self._kinds) if a != b and a[0] == b[0]),
                              "its set of submodules"))
        flags = self._training(module)
        if flags != self._flags:
            self._refuse(next((a[0] for a, b in zip(flags, self._flags) if a != b),
                              "its set of submodules"))
        attr = self._attrs.changed(module)
        if attr is not None:
            self._refuse(attr)
        self._snapshot(module)               # as compiled: the next calls take the fast check

    @staticmethod
    def _refuse(what: str):
        from lumc.ir.errors import InputError
        raise InputError(f"the module changed after lumc.compile copied it ({what}); the compiled "
                         "plan computes the module as it was: compile it again (unchanged "
                         "weights reuse the stored plan)")
