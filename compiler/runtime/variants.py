"""Several compiled plans of one model in one artifact, and the choice between them at call time.

A model compiles into more than one plan when one graph cannot serve every call:

* **explicit sizes** (``--shape sequence_length=16,64,128``, ``shapes={"sequence_length": [16,
  64, 128]}``): one plan per size, each searched at its own shape;
* **an ``If`` on a value known only at run time** whose branches are not one graph (a branch does
  not import at these shapes, or the outputs differ: a sample-rate switch, ``if sr == 16000``):
  one plan per branch, with the condition's own sub-graph kept to decide.

:class:`VariantModel` holds the plans. A call picks its plan by the input shapes (a dict lookup)
and then, where plans differ by an ``If``, by evaluating each condition's sub-graph on the inputs
(the reference executor on a few scalar ops). It never pads, copies or recompiles. A call that no
plan serves is a one-line :class:`~lumc.ir.errors.InputError` naming the input, its shape and
the shapes compiled, or the ``If`` and the branch that does not apply.

Artifact layout: ``variants.json`` (one key per plan: dims, input shapes, conditions), each plan's
parts under ``v0/``, ``v1/``..., condition sub-graphs under ``cond<k>/``, and the model's
``source.onnx`` once at the top level.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from lumc.ir.errors import ArtifactError, InputError
from lumc.ir.graph import Graph
from lumc.ir.serialize import graph_from_bytes, graph_to_bytes
from lumc.compiler.runtime.source_refs import SharedWeights, SourceWeights


@dataclass
class VariantKey:
    """What one plan serves.

    Attributes:
        dims: ``{dynamic dim name: size}`` the plan was compiled at (may be empty).
        shapes: ``{input name: shape}``, the plan's own input shapes.
        conditions: ``{If output name: branch taken}`` (True: ``then_branch``).
    """
    dims: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)
    conditions: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)
    # a range's affine values {probed value: (c, ((prime, m, a), ...))} (lumc.ir.symbolic)
    table: dict = field(default_factory=dict)

    def largest_units(self) -> dict[int, int]:
        """``{probe prime: units}`` of the largest sizes a range bucket serves."""
        return {self.probes[k]: hi // st for k, (lo, hi, st) in self.ranges.items()}

    def describe(self) -> str:
        parts = [f"{k}={lo}" if lo == hi else f"{k}={lo}..{hi}" + (f":{st}" if st > 1 else "")
                 for k, (lo, hi, st) in self.ranges.items()]
        parts += [f"{k}={v}" for k, v in self.dims.items() if not self.ranges] or \
            [f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in self.shapes.items()]
        parts += [f"If {k!r} {'then' if v else 'else'}" for k, v in self.conditions.items()]
        return ", ".join(parts)

    def as_json(self) -> dict:
        return {"dims": dict(self.dims), "shapes": {k: list(v) for k, v in self.shapes.items()},
                "conditions": dict(self.conditions),
                "ranges": {k: list(v) for k, v in self.ranges.items()},
                "probes": dict(self.probes), "axes": {k: [list(a) for a in v]
                                                      for k, v in self.axes.items()},
                "table": [[x, c, [list(f) for f in fs]] for x, (c, fs) in self.table.items()]}

    def sizes_of(self, inputs: dict) -> dict[str, int]:
        """The ranged dims' sizes in ``inputs`` (``{name: array}``), read at their axes.

        Raises:
            InputError: an input of the wrong rank, or two axes of one dim that disagree.
        """
        out: dict[str, int] = {}
        first: dict[str, str] = {}      # where each dim was read first, to name both sides
        for dim, uses in self.axes.items():
            for name, ax in uses:
                if name not in inputs:
                    raise InputError(f"missing input {name!r}", node=name)
                shp = np.shape(inputs[name])
                if ax >= len(shp):
                    raise InputError(f"input {name!r} has shape {tuple(shp)}; its axis {ax} is "
                                     f"dim {dim!r}", node=name)
                v = int(shp[ax])
                first.setdefault(dim, f"input {name!r} axis {ax}")
                if out.setdefault(dim, v) != v:
                    raise InputError(f"dim {dim!r} is {out[dim]} in {first[dim]} and {v} in "
                                     f"input {name!r} axis {ax}; they must be equal", node=name)
        return out

    def holds(self, sizes: dict) -> bool:
        return all(lo <= sizes[k] <= hi and (sizes[k] - lo) % st == 0
                   for k, (lo, hi, st) in self.ranges.items())


class VariantModel:
    """Compiled plans of one model, one per :class:`VariantKey`, chosen per call.

    Args:
        variants: ``[(key, CompiledModel)]`` in compile order.
        conditions: ``{If output name: Graph}`` whose one output is that If's condition, over the
            model inputs it needs.
        skipped: ``[(key, reason)]`` for branches or sizes that did not compile (said when a call
            needs them).
        report: the combined report (``variants`` lists each plan's own).

    ``source_files``: as :attr:`CompiledModel.source_files`, never replaced by :meth:`save`.
    """
    source_files: tuple = ()

    def __init__(self, variants: list, conditions: dict[str, Graph], skipped: list,
                 report: dict, source_onnx: bytes | None = None):
        if not variants:
            raise InputError("no variant of the model compiled: " +
                             "; ".join(f"{k.describe()}: {r}" for k, r in skipped))
        self.variants = list(variants)
        self.conditions = dict(conditions)
        self.skipped = list(skipped)
        self._report = report
        self.source_onnx = source_onnx
        self._by_shape: dict[tuple, list] = {}
        self._ranged = [(k, cm) for k, cm in self.variants if k.ranges]
        self._instances: dict[tuple, object] = {}     # (variant, sizes) -> re-sized plan
        # a torch module's lumc.compile: checks before each call that the module is unchanged
        # (lumc.compiler.core.torch_state.ModuleWatch)
        self.watch = None
        # a torch module's lumc.compile: its output structure, which a call returns (None: one
        # array for one output, else a tuple in output order; lumc.compiler.runtime.out_structure)
        self.structure = None
        for key, cm in self.variants:
            if not key.ranges:
                self._by_shape.setdefault(self._shape_key(key.shapes), []).append((key, cm))

    # ---- the CompiledModel surface (the first plan's where one is needed) -------------------------
    @property
    def first(self):
        return self.variants[0][1]

    def __getattr__(self, name):
        # device, simulated, torch_device, graph, program, configs...: the first plan's
        if name.startswith("_") or name in ("variants", "conditions", "skipped", "source_onnx",
                                            "structure"):
            raise AttributeError(name)
        return getattr(self.variants[0][1], name)

    @property
    def inputs(self):
        if self._ranged:       # the largest sizes of the range
            return self.candidates()[0][1].inputs
        return self.first.inputs

    @property
    def outputs(self):
        return self.first.outputs

    # ---- choosing ---------------------------------------------------------------------------------
    @staticmethod
    def _shape_key(shapes: dict) -> tuple:
        return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items()))

    MAX_INSTANCES = 16   # re-sized plans kept per artifact (least recently used dropped)

    def instance(self, key: VariantKey, template, sizes: dict):
        """``template`` (a bucket's plan at its probe sizes) re-sized to ``sizes``
        (``{dim: size}``), cached (:data:`MAX_INSTANCES`)."""
        from lumc.compiler.runtime.compiled import CompiledModel
        from lumc.compiler.runtime.program import resize_program
        from lumc.ir.symbolic import Resizer
        ck = (id(template), tuple(sorted(sizes.items())))
        hit = self._instances.pop(ck, None)
        if hit is None:
            r = Resizer({key.probes[k]: sizes[k] // key.ranges[k][2] for k in key.ranges},
                        key.table)
            hit = CompiledModel(r.graph(template.graph), resize_program(template.program, r),
                                template.configs, template.device, template.simulated,
                                template.report_dict(), template.source_onnx,
                                template.torch_device)
            # the bucket's own kernels, size-generic (lumc.backends.triton.size_generic)
            names = {key.probes[k]: f"L{i}" for i, k in enumerate(sorted(key.ranges))}
            hit.shape_text = self._shape_text(template)
            hit.size_text = ", ".join(f"{k}={sizes[k]}" for k in sorted(key.ranges))
            hit.sized = (template.program, names,
                         {names[key.probes[k]]: sizes[k] // key.ranges[k][2] for k in key.ranges},
                         key.table, key.largest_units())
        self._instances[ck] = hit
        while len(self._instances) > self.MAX_INSTANCES:
            self._instances.pop(next(iter(self._instances)))
        return hit

    def spans(self) -> dict[str, str]:
        """``{ranged dim: "2..64"}`` (``"64..640 in steps of 32"``): the sizes a range artifact
        serves, over all its buckets; empty for other artifacts."""
        spans = {}
        for k in (self._ranged[0][0].ranges if self._ranged else ()):
            rs = sorted({tuple(kk.ranges[k]) for kk, _ in self._ranged})
            spans[k] = f"{rs[0][0]}..{rs[-1][1]}" + (f" in steps of {rs[0][2]}" if rs[0][2] > 1
                                                      else "")
        return spans

    def range_inputs(self) -> list:
        """A range artifact's input specs with each ranged dim by its name (``(1, seq)``), the
        other dims as compiled; empty for other artifacts."""
        import dataclasses
        if not self._ranged:
            return []
        key, template = self._ranged[0]
        out = []
        for spec in template.inputs:
            shape = list(spec.shape)
            for k, uses in key.axes.items():
                for name, ax in uses:
                    if name == spec.name and ax < len(shape):
                        shape[ax] = k
            out.append(dataclasses.replace(spec, shape=tuple(shape)))
        return out

    def _shape_text(self, template) -> dict[str, str]:
        """``{input: "(2, seq, 16) with seq in 2..64"}``: what a re-sized plan's inputs take, for
        its shape errors (the plan itself holds one size of each range)."""
        spans = self.spans()
        out = {}
        for name, n in template.graph.inputs.items():
            shape = [str(d) for d in n.shape]
            used = []
            for k, uses in self._ranged[0][0].axes.items():
                for nm, ax in uses:
                    if nm == name and ax < len(shape):
                        shape[ax] = k
                        used.append(k)
            if used:
                out[name] = f"({', '.join(shape)}) with " + ", ".join(
                    f"{k} in {spans[k]}" for k in dict.fromkeys(used))
        return out

    def _ranged_pick(self, sizes: dict):
        for key, cm in self._ranged:
            if key.holds(sizes):
                return key, self.instance(key, cm, sizes)
        key0 = self._ranged[0][0]
        for k in key0.ranges:
            spans = sorted({tuple(kk.ranges[k]) for kk, _ in self._ranged})
            lo, hi = spans[0][0], spans[-1][1]
            st = spans[0][2]
            if not (lo <= sizes[k] <= hi) or (sizes[k] - lo) % st:
                where = ", ".join(f"input {n!r} axis {a}" for n, a in key0.axes[k])
                raise InputError(f"dim {k!r} ({where}) is {sizes[k]}; compiled for "
                                 f"{lo}..{hi}" + (f" in steps of {st}" if st > 1 else ""))
        raise InputError(f"sizes {sizes} fall in no compiled bucket ({self.compiled_sizes()})")

    def candidates(self, dims: dict | None = None, shapes: dict | None = None) -> list:
        """The ``(key, model)`` pairs whose dims and input shapes agree with the ones given
        (``--shape`` at ``lumc run``); for a range, its bucket's plan re-sized to them."""
        if self._ranged:
            key0 = self._ranged[0][0]
            sizes = {}
            for k in key0.ranges:
                if dims and k in dims:
                    sizes[k] = int(dims[k])
                else:
                    for name, ax in key0.axes[k]:
                        if shapes and name in shapes and ax < len(shapes[name]):
                            sizes[k] = int(shapes[name][ax])
                if k not in sizes:      # not given: the bucket of the range's largest size
                    sizes[k] = max(kk.ranges[k][1] for kk, _ in self._ranged)
            return [self._ranged_pick(sizes)]
        out = []
        for key, cm in self.variants:
            if dims and any(key.dims.get(k) != v for k, v in dims.items()):
                continue
            if shapes and any(tuple(key.shapes.get(k, ())) != tuple(v) for k, v in shapes.items()):
                continue
            out.append((key, cm))
        return out

    def representatives(self) -> list:
        """``[(description, plan)]``: each variant's plan, a range bucket's re-sized to the size
        it was searched at (its report's ``representative``)."""
        out = []
        for key, cm in self.variants:
            if key.ranges:
                rep = cm.report_dict().get("representative") or {
                    k: hi for k, (lo, hi, st) in key.ranges.items()}
                out.append((f"{key.describe()} at {', '.join(f'{k}={v}' for k, v in rep.items())}",
                            self.instance(key, cm, rep)))
            else:
                out.append((key.describe(), cm))
        return out

    def compiled_sizes(self) -> str:
        return "; ".join(k.describe() for k, _ in self.variants)

    def select(self, inputs: dict):
        """The plan (a :class:`~lumc.compiler.runtime.compiled.CompiledModel`) that serves
        ``inputs`` (``{name: array}``).

        Raises:
            InputError: no plan was compiled for these shapes (naming the first input whose shape
                differs and the shapes compiled), or the inputs take an ``If`` branch that did not
                compile at these shapes (naming it and why).
        """
        if self._ranged:
            return self._ranged_pick(self._ranged[0][0].sizes_of(inputs))[1]
        names = list(self.variants[0][0].shapes)
        shp = {k: tuple(np.shape(inputs[k])) for k in names if k in inputs}
        found = self._by_shape.get(self._shape_key(shp)) if len(shp) == len(names) else None
        if not found:
            for k in names:
                if k not in inputs:
                    raise InputError(f"missing input {k!r}", node=k)
            for k in names:
                seen = sorted({tuple(key.shapes[k]) for key, _ in self.variants})
                if shp[k] not in seen:
                    raise InputError(f"input {k!r} has shape {shp[k]}; compiled for "
                                     f"{' or '.join(map(str, seen))} (variants: "
                                     f"{self.compiled_sizes()})", node=k)
            raise InputError(f"no compiled variant has input shapes {shp} together (variants: "
                             f"{self.compiled_sizes()})")
        if len(found) == 1 and not found[0][0].conditions:
            return found[0][1]
        taken = {c: self._condition(c, inputs) for c in {c for k, _ in found for c in k.conditions}}
        for key, cm in found:
            if all(taken[c] == v for c, v in key.conditions.items()):
                return cm
        for key, reason in self.skipped:
            if self._shape_key(key.shapes) == self._shape_key(shp) and \
                    all(taken.get(c) == v for c, v in key.conditions.items()):
                raise InputError(f"these inputs take {key.describe()}, which did not compile at "
                                 f"these shapes: {reason}")
        raise InputError(f"these inputs take {', '.join(f'If {c!r} ' + ('then' if v else 'else') for c, v in taken.items())}, "
                         f"which no variant serves (variants: {self.compiled_sizes()})")

    def _condition(self, name: str, inputs: dict) -> bool:
        from lumc.backends.reference import ReferenceExecutor
        g = self.conditions[name]
        # an If condition is a value: only its own inputs come to the host
        feed = {k: self._array(inputs[k]) for k in g.inputs}
        v = np.asarray(next(iter(ReferenceExecutor(g)(feed).values())))
        if v.size != 1:
            raise InputError(f"the condition of If {name!r} has {v.size} elements, expected 1")
        return bool(v.reshape(-1)[0])

    # ---- running ----------------------------------------------------------------------------------
    def _named(self, args, kwargs) -> dict:
        from lumc.compiler.runtime.compiled import name_args
        return name_args([i.name for i in self.first.inputs], args, kwargs)

    def _check_given(self, given: dict) -> None:
        """Names, kinds and ranks of a call's inputs, before a plan is chosen by their sizes (a
        rank-2 ``x`` read as ``dim 'B' is 5 in one input and 3 in input 'bias'``, None as shape
        ``()``, a misspelt keyword as a missing input).

        Raises:
            InputError: an unknown or missing input, one that is no array, or of another rank.
        """
        infos = self.first.inputs
        names = [i.name for i in infos]
        unknown = sorted(set(given) - set(names))
        if unknown:
            from lumc.compiler.runtime.compiled import unknown_input_note
            raise InputError(f"unknown input {unknown[0]!r}; inputs are {names}"
                             + unknown_input_note(self.first.source_onnx, unknown[0]))
        for info in infos:
            k = info.name
            if k not in given:
                raise InputError(f"missing input {k!r}", node=k)
            v = given[k]
            if type(v).__module__.startswith("torch") and hasattr(v, "shape"):
                shape = tuple(v.shape)
            elif isinstance(v, (np.ndarray, np.generic, list, tuple, int, float, bool)):
                shape = tuple(np.shape(v))
            else:
                raise InputError(f"input {k!r} is a {type(v).__name__}, not a numeric array",
                                 node=k)
            if len(shape) != len(info.shape):
                raise InputError(f"input {k!r} has rank {len(shape)} (shape {shape}), compiled "
                                 f"for rank {len(info.shape)}", node=k)

    @staticmethod
    def _array(v) -> np.ndarray:
        if type(v).__module__.startswith("torch"):
            from lumc.backends.triton.launch import to_numpy
            return to_numpy(v)
        return np.asarray(v)

    def run(self, inputs: dict) -> dict[str, np.ndarray]:
        """Run the plan that serves ``inputs`` (see :meth:`select`)."""
        if self.watch is not None:
            self.watch.check()
        self._check_given(inputs)
        return self.select(inputs).run(inputs)

    def run_tensors(self, tensors: dict) -> dict:
        """Run the plan that serves ``tensors`` (``{name: torch tensor}``) on their device
        (:meth:`CompiledModel.run_tensors <lumc.compiler.runtime.compiled.CompiledModel.run_tensors>`:
        on a GPU no host copy); only an ``If`` condition's inputs are read on the host."""
        if self.watch is not None:
            self.watch.check()
        return self.select(tensors).run_tensors(tensors)

    def __call__(self, *args, **kwargs):
        if self.watch is not None:
            self.watch.check()
        from lumc.compiler.runtime.in_structure import module_call
        args, kwargs = module_call(self.structure, self.first.graph.inputs, args, kwargs)
        given = self._named(args, kwargs)
        self._check_given(given)
        out = self.select(given)(given)
        if self.structure is None:
            return out
        names = list(self.first.graph.outputs)
        return self.structure.build(dict(zip(names, list(out) if len(names) > 1 else [out])))

    # ---- report and artifact -----------------------------------------------------------------------
    def report_dict(self) -> dict:
        return json.loads(json.dumps(self._report))

    def report(self) -> str:
        """One section per plan (``CompiledModel.report``: its kernels, and the precision it runs
        at with its measured quality and notes: each size bucket's own), then those not compiled."""
        lines = [f"lumc compiled model: {len(self.variants)} variants, chosen per call by "
                 "input shapes and If conditions"]
        for key, cm in self.variants:
            lines.append(f"== variant {key.describe()}")
            lines.append(cm.report())
        for key, reason in self.skipped:
            lines.append(f"== not compiled: {key.describe()}: {reason}")
        from lumc.compiler.runtime.report_text import eager_text
        ec = eager_text(self._report.get("eager_check"))
        if ec:
            lines.append(ec)
        return "\n".join(lines)

    def save(self, path) -> str:
        """Write one ``.lumc`` artifact holding every plan (see the module docstring)."""
        from lumc import __version__
        from lumc.compiler.runtime.artifact import refuse_source_files, save_artifact
        refuse_source_files(path, self.source_files)
        return save_artifact(path, self._saved_parts(), __version__)

    def __reduce__(self):
        """Pickled (and deep-copied) as its artifact: what ``save`` and ``lumc.load`` give (a
        torch module's copy no longer watches the module, as a loaded artifact does not)."""
        from lumc.compiler.runtime.compiled import pickled_artifact
        return pickled_artifact(self._saved_parts(), self.variants[0][1].torch_device)

    def _saved_parts(self) -> dict[str, bytes]:
        from lumc.compiler.runtime.compiled import STRUCTURE_PART, structure_bytes
        parts: dict[str, bytes] = {}
        stored: dict[str, str] = {}     # weights' sha256 -> the part holding them
        shared = SharedWeights(self.source_onnx) if self.source_onnx else None
        for i, (key, cm) in enumerate(self.variants):
            for name, data in cm.parts(shared).items():
                if name == "consts.npz":
                    # a size bucket's weights are the model's, byte for byte: stored once, the
                    # other buckets name that part (a 4-bucket MiniLM was 4 copies, 345 MB)
                    digest = hashlib.sha256(data).hexdigest()
                    if digest in stored:
                        parts[f"v{i}/{CONSTS_REF}"] = stored[digest].encode()
                        continue
                    stored[digest] = f"v{i}/{name}"
                if name != "source.onnx":
                    parts[f"v{i}/{name}"] = data
        conds = {}
        for j, (name, g) in enumerate(self.conditions.items()):
            doc, npz, _ = graph_to_bytes(g)
            parts[f"cond{j}/graph.json"] = doc
            parts[f"cond{j}/consts.npz"] = npz
            conds[name] = f"cond{j}/"
        if self.source_onnx is not None:
            parts["source.onnx"] = self.source_onnx
        parts["variants.json"] = json.dumps({
            "variants": [k.as_json() for k, _ in self.variants],
            "skipped": [[k.as_json(), r] for k, r in self.skipped],
            "conditions": conds}).encode()
        parts["report.json"] = json.dumps(self._report, indent=1).encode()
        structure = structure_bytes(self.structure)
        if structure is not None:
            parts[STRUCTURE_PART] = structure
        return parts


def _key(path, d) -> VariantKey:
    if not isinstance(d, dict) or not all(isinstance(d.get(k, {}), dict)
                                          for k in ("dims", "shapes", "conditions")):
        raise ArtifactError(f"{path}: part 'variants.json' has a malformed variant key")
    try:
        key = VariantKey({str(k): int(v) for k, v in d.get("dims", {}).items()},
                         {str(k): tuple(int(x) for x in v) for k, v in d.get("shapes", {}).items()},
                         {str(k): bool(v) for k, v in d.get("conditions", {}).items()},
                         {str(k): [int(x) for x in v] for k, v in d.get("ranges", {}).items()},
                         {str(k): int(v) for k, v in d.get("probes", {}).items()},
                         {str(k): [[str(a), int(b)] for a, b in v]
                          for k, v in d.get("axes", {}).items()},
                         {int(x): (int(c), tuple((int(p), int(m), int(a)) for p, m, a in fs))
                          for x, c, fs in d.get("table", [])})
        if any(len(v) != 3 or v[2] < 1 for v in key.ranges.values()) or \
                set(key.ranges) != set(key.probes) or set(key.ranges) != set(key.axes) or \
                any(p < 3 for p in key.probes.values()) or \
                any(p not in key.probes.values() for _, fs in key.table.values() for p, _, _ in fs):
            raise ValueError
        return key
    except (TypeError, ValueError, AttributeError):
        raise ArtifactError(f"{path}: part 'variants.json' has a malformed variant key") from None


def _largest(key: VariantKey):
    """A range bucket's re-sizer to its largest sizes (its plan is stored at probe sizes, which a
    call never runs at), None for a plan of fixed sizes."""
    if not key.ranges:
        return None
    from lumc.ir.symbolic import Substitution
    return Substitution(key.largest_units(), key.table)


def load_variants(path, parts: dict[str, bytes], device: str | None = None) -> VariantModel:
    """The :class:`VariantModel` of a verified artifact's ``parts``.

    Raises:
        ArtifactError: a malformed ``variants.json`` or a missing or corrupt variant part.
    """
    from lumc.compiler.runtime.artifact_schema import check_json_part
    from lumc.compiler.runtime.compiled import STRUCTURE_PART, from_parts
    doc = check_json_part(str(path), "variants.json", parts["variants.json"])
    if not isinstance(doc.get("variants"), list) or not isinstance(doc.get("conditions", {}), dict) \
            or not isinstance(doc.get("skipped", []), list):
        raise ArtifactError(f"{path}: part 'variants.json' lacks its variant list")
    keys = [_key(path, d) for d in doc["variants"]]
    parts = resolve_consts_refs(path, parts)
    weights = SourceWeights(parts.get("source.onnx"))    # one parse for every plan
    variants = [(key, from_parts(path, parts, device, f"v{i}/", sized_at=_largest(key),
                                 weights=weights))
                for i, key in enumerate(keys)]
    conditions = {}
    for name, prefix in doc.get("conditions", {}).items():
        if not isinstance(prefix, str) or prefix + "graph.json" not in parts \
                or prefix + "consts.npz" not in parts:
            raise ArtifactError(f"{path}: condition {name!r} of 'variants.json' has no graph part")
        g, _ = graph_from_bytes(parts[prefix + "graph.json"], parts[prefix + "consts.npz"])
        conditions[name] = g
    skipped = []
    for item in doc.get("skipped", []):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
            raise ArtifactError(f"{path}: part 'variants.json' has a malformed skipped entry")
        skipped.append((_key(path, item[0]), item[1]))
    report = json.loads(parts.get("report.json", b"{}"))
    for name, _ in conditions.items():
        if not any(name in k.conditions for k, _ in variants):
            raise ArtifactError(f"{path}: condition {name!r} selects no variant")
    vm = VariantModel(variants, conditions, skipped, report, parts.get("source.onnx"))
    if STRUCTURE_PART in parts:
        from lumc.compiler.runtime.out_structure import OutputStructure
        vm.structure = OutputStructure.from_bytes(path, parts[STRUCTURE_PART],
                                                  list(vm.first.graph.outputs))
    return vm


CONSTS_REF = "consts.ref"     # a variant's weights stored in another variant's part (its name)


def resolve_consts_refs(path, parts: dict[str, bytes]) -> dict[str, bytes]:
    """``parts`` with each ``vI/consts.ref`` replaced by the ``consts.npz`` part it names.

    Raises:
        ArtifactError: a reference to no stored weights part.
    """
    out = dict(parts)
    for name, data in parts.items():
        if name.rsplit("/", 1)[-1] != CONSTS_REF:
            continue
        ref = data.decode("utf-8", "replace")
        if not ref.endswith("/consts.npz") or ref not in parts:
            raise ArtifactError(f"{path}: part {name!r} names no stored weights part ({ref[:80]!r})")
        out[name[:-len(CONSTS_REF)] + "consts.npz"] = parts[ref]
    return out
