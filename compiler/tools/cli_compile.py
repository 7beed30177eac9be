"""``lumc compile``: the main job on the command line, and running a compiled artifact
(``lumc run ART``; the caches are ``lumc cache``, :mod:`lumc.compiler.tools.cli_cache`).

    lumc compile MODEL --budget 30m [-o OUT.lumc] [--device cuda[:N] | sim:h100 | sim:h200]
                 [--shape NAME=DIMS ...] [--input NAME=FILE.npy ...] [--inputs FILE.npz]
                 [--report REPORT.json] [--no-egraph] [--quiet]
                 [--workers local:N | ray | ray://HOST:PORT]
"""
from __future__ import annotations

import os
import pathlib

import click

from lumc.compiler.runtime.artifact import (PYTORCH_HINT, check_writable, looks_like_artifact,
                                            model_files, pytorch_archive, refuse_same_file,
                                            strict_json,
                                            write_atomic)
from lumc.compiler.core.budget import parse_duration
from lumc.compiler.runtime.compiled import unknown_input_note
from lumc.compiler.runtime.report_text import (precision_lines, sampled_text, search_text,
                                                user_notes, workspace_text)
from lumc.compiler.tools.cli import _parse_shapes, cli, nonempty_path
from lumc.ir.errors import InputError, LumcError

_COMPILE_HELP = """Compile MODEL (an .onnx file) into the fastest correct program lumc finds within
the budget, and save it as a self-contained .lumc artifact (weights, plan, report and the source
model).

DURATION looks like 90s, 30m, 1h or 1h30m; it is a hard deadline for the whole compile. Without a
GPU (or with --device sim:h100/sim:h200) kernel times come from an analytical model of that GPU and
the output says they are simulated; the compiled model then runs on the CPU executor. A second
compile of the same model reuses the tuning database and re-times nothing.

--shape is checked as `lumc run` checks it: every NAME must be an input or a dynamic dim of the
model, given once, and bindings must agree. -o and --report are written atomically (missing
folders are created, a symlink is followed); they never replace the model, each other, a device,
a FIFO or a directory. Ctrl-C or SIGTERM stops the compile with nothing half-written.

--input NAME=FILE.npy and --inputs FILE.npz give example inputs (their shapes fix the model's
dynamic dims, as `lumc run`'s do): every kernel and the plan are checked against the reference on
them, and a reduced --precision's quality gate measures on them. Inputs not given are drawn (N(0, 1)
floats; integers in the range of the table they index, else [0, 8)); a model that computes
indices or divisors from its inputs may need real ones.

--workers spreads the work units (numerics checks on sim:*; compile, check and time on a GPU) over
N local processes (local:N), the Ray cluster RAY_ADDRESS names or a local one started for this
compile (ray), or a Ray cluster through Ray Client (ray://HOST:PORT; pip install
'lumc[distributed]'). The search, the budget and the tuning database stay here; the same inputs
give the same choice whatever the number of workers.
"""


def _secs(x: float) -> str:
    """Seconds for a summary line: three significant digits, whole seconds from 100 s up."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _example_arrays(model: str, inputs_npz, input_pairs: tuple, *outputs) -> dict:
    """``--inputs`` / ``--input`` arrays, checked like ``lumc run``'s: readable, named after an
    input of the model, of its dtype, and never a file the compile writes.

    Raises:
        InputError: one line naming the input or file.
    """
    from lumc.compiler.frontends import onnx_frontend as fe
    from lumc.compiler.tools.cli import _input_files, _load_arrays
    for f in _input_files(inputs_npz, input_pairs):
        for o in outputs:
            if o:
                refuse_same_file(o, f, "an input file")
    arrays = _load_arrays(inputs_npz, input_pairs)
    if not arrays:
        return {}
    onnx_model = fe.load_model(model)
    specs = {s.name: s for s in fe.model_input_specs(onnx_model)}
    for name, a in arrays.items():
        if name not in specs:
            raise InputError(f"unknown input {name!r}; the model's inputs are "
                             f"{', '.join(specs) or 'none'}"
                             + unknown_input_note(onnx_model, name),
                             node=name)
        if a.dtype != specs[name].dtype.np:
            raise InputError(f"input {name!r} has dtype {a.dtype}, expected "
                             f"{specs[name].dtype.np}", node=name)
    return arrays


def _model_shapes(model: str, shape_items: tuple, arrays: dict | None = None) -> dict:
    """Whole-input shapes for ``compile_model`` from ``--shape`` and the example ``arrays``,
    checked like ``lumc run``'s (unknown names, repeats, conflicts, unset dynamic dims, inputs too
    large for memory)."""
    from lumc.compiler.frontends import onnx_frontend as fe
    from lumc.compiler.tools.cli import check_input_sizes, resolve_shapes
    import itertools
    shape_args = _parse_shapes(shape_items)
    m = fe.load_model(model)
    specs = fe.model_input_specs(m)
    from lumc.compiler.core.buckets import DimRange
    ranged = {k: v for k, v in shape_args.items() if isinstance(v, DimRange)}
    if ranged:      # each bucket is checked by the compile (its sizes are probed, then re-sized)
        symbols = {d for s in specs for d in s.shape if isinstance(d, str)}
        for k in ranged:
            if k not in symbols:
                raise InputError(f"--shape {k}: a range names a dynamic dim; the model's dynamic "
                                 f"dims are {', '.join(sorted(symbols)) or 'none'}")
        return shape_args
    lists = {k: v for k, v in shape_args.items() if isinstance(v, list)}
    if not lists:
        shapes = resolve_shapes(specs, shape_args, arrays or {})
        check_input_sizes(shapes, {s.name: s.dtype.np for s in specs})
        return shapes
    # several sizes: each combination is checked here; compile_model makes one plan per size
    for vals in itertools.product(*lists.values()):
        one = {**shape_args, **{k: (v if isinstance(v, tuple) else (v,))
                                for k, v in zip(lists, vals)}}
        check_input_sizes(resolve_shapes(specs, one, {}), {s.name: s.dtype.np for s in specs})
    return shape_args


@cli.command("compile", help=_COMPILE_HELP)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--budget", "budget", required=True, metavar="DURATION", help="e.g. 90s, 30m, 1h")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False), callback=nonempty_path,
              help="artifact path (default: MODEL with .lumc)")
@click.option("--device", default=None, help="cuda[:N], sim:h100 or sim:h200 (default: first GPU, "
              "else sim:h200)")
@click.option("--shape", "shape_items", multiple=True, metavar="NAME=DIMS",
              help="an input's shape (x=1x3x224x224) or a dynamic dim (batch_size=2); repeatable")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), callback=nonempty_path,
              help="write the report JSON")
@click.option("--input", "input_pairs", multiple=True, metavar="NAME=FILE.npy",
              help="an example input array (repeatable): the numerics checks run on it")
@click.option("--inputs", "inputs_npz", type=click.Path(dir_okay=False), metavar="FILE.npz",
              callback=nonempty_path, help="example input arrays from an .npz keyed by input name")
@click.option("--no-egraph", is_flag=True, help="greedy fusion only (the ablation baseline)")
@click.option("--precision", default="fp32", show_default=True,
              type=click.Choice(["fp32", "tf32", "bf16", "fp16", "fp8", "auto"]),
              help="contraction precision policy (fp32 runs on tensor cores as split TF32)")
@click.option("--weights", default="same", show_default=True,
              type=click.Choice(["same", "int8", "fp8", "nvfp4"]),
              help="weight-only quantization of contraction weights (int8, fp8 e4m3: per output "
              "channel; nvfp4: e2m1 with an e4m3 scale per 16 along K and a per-tensor scale); "
              "refused for a model with no weight read only by matrix products")
@click.option("--tolerance", default=None, type=float, metavar="RTOL",
              help="quality gate: max rel error of every output (default by --precision); "
                   "for a reduced --precision or --weights (refused at fp32 with the model's "
                   "weights, where no gate runs)")
@click.option("--max-kl", "max_kl", default=None, type=float, metavar="X",
              help="quality gate: mean KL divergence per row of probability/logit outputs "
                   "(an error when no output is a distribution and no --logits names one)")
@click.option("--logits", "logits", multiple=True, metavar="NAME",
              help="an output holding logits (KL and top-1 after softmax); repeatable")
@click.option("--bind", "bind_items", multiple=True, metavar="NAME=VALUE",
              help="fix a scalar input at compile time (a sample rate: sr=16000; an input of "
                   "static shape takes all its values, comma-separated); an If on it folds to "
                   "its branch, and the artifact no longer takes it; repeatable")
@click.option("--fast-math", "fast_math", is_flag=True,
              help="allow rewrites that change results for speed (a / b as a * (1/b)); off by "
                   "default, where division is IEEE")
@click.option("--workers", "workers", default=None, metavar="SPEC",
              help="where work units run: local:N, ray (RAY_ADDRESS or a local cluster) or "
                   "ray://HOST:PORT (default: a local pool on sim when cores > 1)")
@click.option("--quiet", is_flag=True, help="no progress display")
def compile_cmd(model, budget, out, device, shape_items, report_path, input_pairs, inputs_npz,
                no_egraph, precision, weights, tolerance, max_kl, logits, bind_items, fast_math,
                workers, quiet):
    from lumc.compiler.tools.cli import _interrupt_text, caused_by_interrupt
    written: list[str] = []
    policy = {"precision": precision, "weights": weights, "tolerance": tolerance,
              "max_kl": max_kl, "logits": tuple(logits)}
    # what each output was before: a signal just after a file was replaced, before the compile
    # noted it, said "nothing was written" of a new artifact
    try:
        before = {str(p): _file_identity(p) for p in (_out_path(model, out), report_path) if p}
    except ValueError:          # no file name to write (refused in _compile)
        before = {}
    try:
        _compile(model, budget, out, device, shape_items, report_path, no_egraph, quiet, written,
                 policy, fast_math=fast_math, bind=parse_binds(bind_items), workers=workers,
                 examples=(inputs_npz, input_pairs))
    except (KeyboardInterrupt, Exception) as err:
        if not caused_by_interrupt(err):
            raise
        written += [p for p, was in before.items()
                    if p not in written and _file_identity(p) not in (was, None)]
        done = (f"only {' and '.join(written)} {'was' if len(written) == 1 else 'were'} written"
                if written else "nothing was written")
        what = "interrupted" if _interrupt_text(err).startswith("interrupted") else _interrupt_text(err)
        raise LumcError(f"{what}: {done}; timings measured so far are kept in the tuning "
                        "database") from None


def _out_path(model, out) -> pathlib.Path:
    """Where ``lumc compile MODEL [-o OUT]`` writes its artifact."""
    return pathlib.Path(out) if out else pathlib.Path(model).with_suffix(".lumc")


def _file_identity(path) -> tuple | None:
    """``(device, inode, mtime ns, size)`` of the file ``path`` names (a symlink followed: the
    file an atomic write replaces), None where there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def parse_binds(items) -> dict:
    """``--bind NAME=VALUE`` (a number, or comma-separated numbers) -> ``{name: value}``.

    Raises:
        InputError: a malformed item or a name given twice.
    """
    from lumc.ir.errors import InputError
    out: dict = {}
    for item in items:
        name, eq, text = item.partition("=")
        try:
            vals = [int(t) if t.strip().lstrip("+-").isdigit() else float(t)
                    for t in text.split(",")] if eq and name and text else None
        except ValueError:
            vals = None
        if vals is None:
            raise InputError(f"bad --bind {item!r}: expected NAME=VALUE (e.g. sr=16000)")
        if name in out:
            raise InputError(f"--bind {name} is given twice")
        out[name] = vals[0] if len(vals) == 1 else vals
    return out


def _compile(model, budget, out, device, shape_items, report_path, no_egraph, quiet, written,
             policy: dict | None = None, fast_math: bool = False, bind: dict | None = None,
             workers: str | None = None, examples: tuple = (None, ())):
    from lumc.compiler.core.pipeline import compile_model
    from lumc.compiler.core.workers import parse_workers
    parse_duration(budget)                     # a bad budget fails before any work
    parse_workers(workers)                     # so does a bad --workers (or Ray missing)
    out_path = _out_path(model, out)
    if not pathlib.Path(model).is_file():
        raise LumcError(f"{model}: no such file" if not pathlib.Path(model).exists()
                        else f"{model}: not a file")
    if looks_like_artifact(model):
        kind = pytorch_archive(model)
        if kind:       # torch.save writes a zip too: it is no artifact
            raise LumcError(f"{model} is a PyTorch file ({kind}), not an ONNX model; "
                            f"{PYTORCH_HINT}")
        raise LumcError(f"{model} is a compiled .lumc artifact, not an ONNX model; compile the "
                        "source model (lumc run/bench/inspect take the artifact)")
    sources = model_files(model)          # the model file and its external data files
    for f, what in sources:
        refuse_same_file(out_path, f, what)
    if report_path:
        for f, what in sources:
            refuse_same_file(report_path, f, what)
        refuse_same_file(report_path, out_path, "the artifact output")
        check_writable(report_path)
    check_writable(out_path)
    from lumc.compiler.core.precision import PrecisionPolicy
    PrecisionPolicy.from_user(**(policy or {}))          # bad options fail before any work
    arrays = _example_arrays(model, *examples, out_path, report_path)
    shapes = _model_shapes(model, shape_items, arrays)
    cm = compile_model(model, budget=budget, device=device, shapes=shapes,
                       example_inputs=arrays or None,
                       use_egraph=not no_egraph, quiet=quiet, fast_math=fast_math, bind=bind,
                       workers=workers, **(policy or {}))
    cm.save(out_path)
    written.append(str(out_path))
    r = cm.report_dict()
    if report_path:
        write_atomic(report_path, strict_json(r))    # an infinite error is written as null
        written.append(str(report_path))
    if "variants" in r:
        _echo_variants(cm, r, out_path, report_path)
        return
    unit = "SIMULATED" if r["simulated"] else "measured"
    best = r["best_time_s"]
    best_s = f"{best * 1e6:.1f} us" if best is not None else "untimed"
    click.echo(f"compiled {r['model']} for {r['device']} ({unit} times) in {_secs(r['compile_s'])} s "
               f"of {_secs(r['budget_s'])} s: {r['stopped_because']}")
    click.echo(f"  {r['kernels']} kernel{'s' * (r['kernels'] != 1)}, best {best_s}, bound {r['bound_time_s'] * 1e6:.1f} us (roofline + launches)"
               f", bytes moved {r['bytes_moved'] / 1e6:.2f} MB (ideal {r['ideal_bytes'] / 1e6:.2f} MB"
               + workspace_text(r) + ")")
    earlier = " (the earlier compile's, whose plan this reuses)" if r.get("reused_plan") else ""
    click.echo(f"  search{earlier}: {search_text(r)}")
    click.echo(f"  numerics checks (each chosen kernel, and the plan end "
               f"to end, against the search's reference): max rel error " + _max_rel_text(r)
               + sampled_text(r))
    for line in precision_lines(r):     # the wording CompiledModel.report() shares
        click.echo(f"  {line}")
    w = r.get("workers")
    if w and w["kind"] != "in-process":
        click.echo(f"  workers: {w['count']} {w['kind']}, units per worker "
                   f"{w['units_per_worker']}, {w['units_lost']} lost, {w['retried']} retried")
    eg = r["egraph"]
    if eg.get("used"):
        click.echo(f"  e-graph: {eg.get('enodes')} e-nodes, {eg.get('eclasses')} e-classes, "
                   f"{eg.get('saturation_s') or 0:.2f} s")
    elif eg.get("error"):
        click.echo(f"  e-graph: not used ({eg['error']})")
    click.echo(f"wrote {out_path}" + (f" and {report_path}" if report_path else ""))


def _max_rel_text(r: dict) -> str:
    """The summary's max rel error: "not checked" where no kernel config went through the
    measurer, whose numerics check is the one that runs the generated code (the plan's run on the
    reference executor alone says 0 by construction)."""
    if r.get("max_rel_error") is None:
        return "not checked (budget)"
    late = r.get("checked_after_budget")
    if late:
        n = r.get("kernels")     # the plan's launches; a repeated layer's kernels are checked once
        which = (f"{late} distinct kernel{'s' * (late != 1)} (of the plan's {n})" if n and n != late
                 else f"{late} kernel{'s' * (late != 1)}")
        return (f"{r['max_rel_error']:.2e} (nothing was measured within the budget: the "
                f"fallback's {which} checked after it)")
    if r.get("kernels") == 0:    # every output a constant (empty, or folded): nothing to run
        return f"{r['max_rel_error']:.2e} (no kernel: every output is a constant)"
    if r.get("candidates_compiled") == 0:
        return "not checked (no candidate compiled within the budget)"
    return f"{r['max_rel_error']:.2e}"


def _echo_variants(cm, r, out_path, report_path) -> None:
    """The summary of a compile into several plans: one line per plan, one per branch or size not
    compiled (``lumc.compiler.core.variants``)."""
    unit = "SIMULATED" if r["simulated"] else "measured"
    click.echo(f"compiled {r['model']} for {r['device']} ({unit} times) into {len(r['variants'])} "
               f"plan{'s' * (len(r['variants']) != 1)} in {_secs(r['compile_s'])} s of {_secs(r['budget_s'])} s, chosen per call")
    reduced = any(v.get("quality") is not None for v in r["variants"])
    for v in r["variants"]:
        best = v.get("best_time_s")
        best_s = f"{best * 1e6:.1f} us" if best is not None else "untimed"
        click.echo(f"  {v['describe']}: {v['kernels']} kernel{'s' * (v['kernels'] != 1)}, best "
                   f"{best_s}, bound "
                   f"{(v.get('bound_time_s') or 0) * 1e6:.1f} us, {v['stopped_because']}")
        if reduced:     # each plan's own measured quality (a plan may have fallen back alone)
            click.echo(f"    {precision_lines(dict(v, warnings=[]), exact=True)[0]}")
    for v in r.get("not_compiled", []):
        click.echo(f"  not compiled: {v['describe']}: {v['reason']}")
    for w in user_notes(r):
        click.echo(f"  note: {w}")
    click.echo(f"wrote {out_path}" + (f" and {report_path}" if report_path else ""))


def _pick_variant(cm, path, shape_args: dict, arrays: dict):
    """The plan of a variant artifact that ``--shape`` (dims or input shapes) and the given
    arrays' shapes select (the first one left: an ``If`` then decides once inputs are made); a
    single-plan artifact is itself, and refuses ``--shape``."""
    from lumc.compiler.runtime.variants import VariantModel
    if not isinstance(cm, VariantModel):
        if shape_args:
            raise InputError(f"--shape applies to an ONNX model, and {path} is a compiled "
                             "artifact (its shapes are fixed at compile time); recompile with "
                             "--shape instead")
        return cm
    for k, v in shape_args.items():
        if isinstance(v, list):
            raise InputError(f"--shape {k}: one size per run")
    inputs = set(cm.first.graph.inputs)
    known = {d for key, _ in cm.variants for d in (*key.dims, *key.ranges)}
    fixed = _fixed_dims(cm, known)
    shape_args = dict(shape_args)
    for k in list(shape_args):
        if k in fixed and k not in inputs:
            # a dynamic dim the compile fixed (--shape B=1 beside a range): its one size only
            if list(shape_args[k]) != [fixed[k]]:
                raise InputError(f"--shape {k}={'x'.join(map(str, shape_args[k]))}: {path} was "
                                 f"compiled with {k}={fixed[k]}")
            del shape_args[k]
        elif k not in inputs and k not in known:
            raise InputError(f"--shape {k}: no input or compiled dynamic dim of that name; "
                             f"variants: {cm.compiled_sizes()}")
    specs = cm.range_inputs()
    if specs:   # a size range: each ranged dim given once (--shape or an array), never guessed
        from lumc.compiler.tools.cli import resolve_shapes
        return cm.candidates(None, resolve_shapes(specs, shape_args, arrays, cm.spans()))[0][1]
    dims = {k: v[0] for k, v in shape_args.items() if k not in inputs and len(v) == 1}
    shapes = {k: v for k, v in shape_args.items() if k in inputs}
    shapes.update({k: tuple(a.shape) for k, a in arrays.items() if k in inputs})
    found = cm.candidates(dims, shapes)
    if not found:
        want = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in {**shape_args}.items())
        raise InputError(f"{want or 'these inputs'}: outside what {path} was compiled for "
                         f"(variants: {cm.compiled_sizes()})")
    if len({tuple(sorted((n, tuple(v)) for n, v in k.shapes.items())) for k, _ in found}) > 1:
        # plans at several sizes and none named: refused, not the first one
        open_ = [d for d in dict.fromkeys(d for k, _ in found for d in k.dims)
                 if len({k.dims.get(d) for k, _ in found}) > 1]
        what = (f"dynamic dim {open_[0]} unset (compiled for {open_[0]}="
                + ", ".join(dict.fromkeys(str(k.dims.get(open_[0])) for k, _ in found)) + ")"
                if open_ else f"input sizes unset (variants: {cm.compiled_sizes()})")
        hint = (f"--shape {open_[0]}={found[0][0].dims.get(open_[0])} (or another size it was "
                f"compiled for)" if open_ else "--shape INPUT=<shape>")
        raise InputError(f"{what}; give {hint} or inputs of one compiled size")
    return found[0][1]


def _fixed_dims(cm, known: set) -> dict[str, int]:
    """``{dim name: size}`` of the source model's dynamic input dims that a variant artifact's
    compile fixed (not among its plans' ``known`` dims or ranges): the size every plan's input has
    on that axis. Empty without a source model."""
    if not getattr(cm, "source_onnx", None):
        return {}
    import onnx
    fixed: dict[str, set] = {}
    for vi in onnx.load_from_string(cm.source_onnx).graph.input:
        for ax, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param and d.dim_param not in known:
                for _, plan in cm.variants:
                    n = plan.graph.inputs.get(vi.name)
                    if n is not None and ax < len(n.shape):
                        fixed.setdefault(d.dim_param, set()).add(int(n.shape[ax]))
    return {k: v.pop() for k, v in fixed.items() if len(v) == 1}


def _judge_graph(cm, reduced: bool, inputs: dict):
    """The graph whose float64 values judge lumc against onnxruntime: the model as the user gave
    it. A reduced-precision artifact (``--precision bf16|fp16|fp8|auto``, ``--weights
    int8|fp8|nvfp4``) holds a graph with its weights rounded or quantized, where that error would
    count for lumc; its source model is imported again instead (at the inputs' shapes). Falls back
    to the artifact's graph where the source needs an input the run does not have (one fixed by
    ``--bind``)."""
    if not reduced or not cm.source_onnx:
        return cm.graph
    import numpy as np
    import onnx
    from lumc.compiler.frontends.onnx_frontend.importer import import_onnx
    graph = import_onnx(onnx.load_from_string(cm.source_onnx),
                        {k: np.shape(v) for k, v in inputs.items()}).graph
    return graph if set(graph.inputs) <= set(inputs) else cm.graph


def _eager_note(report: dict) -> str:
    """``; its compile matched PyTorch eager on the example inputs (max rel error 3e-07)`` from
    a torch artifact's report, where the compile recorded that check."""
    ec = report.get("eager_check") or {}
    if "passed" not in ec:
        return ""
    where = (f"at {len(ec['sizes'])} sizes of its range" if ec.get("sizes") else
             "on the example inputs")
    return (f"; at compile the lowering {'matched' if ec['passed'] else 'did NOT match'} PyTorch "
            f"eager {where} (max rel error {ec.get('max_rel_error', 0):.3g})")


def _largest_finite(v) -> float:
    """The largest finite |v| (0 for none): a NaN or inf in a reference output made the tolerance
    NaN (every element failed) or inf (every element passed)."""
    import numpy as np
    a = np.abs(np.asarray(v, dtype=np.float64))
    return float(a.max(initial=0.0, where=np.isfinite(a)))


def run_artifact(path, arrays, use_random, seed, check, rtol, out_path, backend="reference",
                 atol=None, shape_args=None):
    """``lumc run ART.lumc``: run a compiled artifact; ``--check`` runs onnxruntime on the source
    model stored inside it (no original file needed). ``backend="triton"`` launches the artifact's
    own kernels (``lumc.backends.triton.run_program``; the Triton interpreter without a GPU)."""
    import time

    import numpy as np

    from lumc.compiler.tools import cli as c
    from lumc.compiler.frontends import models
    from lumc.compiler.runtime.compiled import load

    whole = load(path)
    every = [s.name for s in whole.inputs]       # a misnamed array before any size is asked for
    if set(arrays) - set(every):
        bad = sorted(set(arrays) - set(every))[0]
        raise InputError(f"unknown input {bad!r}; the model's inputs are {', '.join(every)}"
                         + unknown_input_note(whole.source_onnx, bad), node=bad)
    cm = _pick_variant(whole, path, shape_args or {}, arrays)
    # a torch module's artifact has no ONNX model for onnxruntime: --check compares with the
    # float64 evaluation of the graph it stores (the module as lowered, which its compile checked
    # against PyTorch eager)
    by_graph = check and not cm.source_onnx
    specs = cm.inputs
    names = [s.name for s in specs]
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are {', '.join(names)}",
                         node=unknown[0])
    missing = [s for s in specs if s.name not in arrays]
    if missing and not use_random:
        s = missing[0]
        raise InputError(f"missing input {s.name!r} (shape {c._fmt_shape(s.shape)}, {s.dtype.np}); "
                         f"give --input {s.name}=FILE.npy, --inputs FILE.npz or --random", node=s.name)
    info = models.identify_bytes(cm.source_onnx) if cm.source_onnx else None
    inputs = dict(arrays)
    uses = {}
    if cm.source_onnx:
        import onnx
        from lumc.compiler.runtime.index_ranges import index_uses
        uses = index_uses(onnx.load_from_string(cm.source_onnx), {s.name: s.shape for s in specs})
    from lumc.compiler.runtime.index_ranges import check_index_inputs, random_int_highs
    if missing:
        inputs.update(c.random_missing(specs, missing, {s.name: s.shape for s in specs}, seed,
                                       info, random_int_highs(uses)))
    check_index_inputs(uses, inputs)   # an index outside its table: one line, on every backend
    if whole is not cm:
        cm = whole.select(inputs)      # the plan these inputs take (an If's branch)
    if any((cfg or {}).get("IMPL", "triton") != "triton" for cfg in cm.configs):
        import torch  # noqa: F401  (a vendor kernel runs through torch: its import is not run time)
    t0 = time.perf_counter()
    if backend == "triton" and getattr(cm, "sized", None):    # a range bucket's plan
        from lumc.backends.triton.runner import execution_mode, run_program_sized
        from lumc.compiler.runtime.extern import config_from_dict, impl_of, launcher_for
        program, probes, sizes, table, largest = cm.sized
        # the plan's configs; a vendor kernel's call runs through torch at this call's sizes
        # (as GpuPlan runs it), the others as the bucket's size-generic Triton modules
        cfgs = [config_from_dict(cfg) if impl_of(cfg) == "triton" else None for cfg in cm.configs]
        ext = [None if impl_of(cfg) == "triton" else
               (launcher_for(c.kernel, cfg), config_from_dict(cfg))
               for c, cfg in zip(cm.program.calls, cm.configs)]
        outputs = run_program_sized(program, inputs, probes, sizes, table=table, largest=largest,
                                    configs=cfgs, launchers=ext)
        where = (f"Triton kernels, one size-generic module per kernel of the bucket at "
                 f"{cm.size_text}, {execution_mode()}")
    elif backend == "triton":
        from lumc.backends.triton.runner import execution_mode, run_program
        from lumc.compiler.runtime.extern import config_from_dict, launcher_for
        # each kernel at the plan's config (its precision, tiles, vendor implementation); it ran
        # every kernel at the interpreter's default config, so a bf16/fp8 plan's kernels at fp32
        launchers = [(launcher_for(c.kernel, cfg), config_from_dict(cfg))
                     for c, cfg in zip(cm.program.calls, cm.configs)]
        outputs = run_program(cm.program, inputs, launchers=launchers)   # checks what it reads
        where = f"Triton kernels, {execution_mode()}"
    else:
        outputs = cm.run(inputs)
        where = cm.torch_device if cm.torch_device != "cpu" else "CPU executor"
    t1 = time.perf_counter()
    r = cm.report_dict()
    click.echo(f"{pathlib.Path(path).name}: compiled for {cm.device}"
               f"{' (simulated times)' if cm.simulated else ''}, {len(cm.program)} kernel"
               f"{'s' * (len(cm.program) != 1)}, "
               f"running on {where}")
    click.echo("inputs: " + ", ".join(
        f"{n} {c._fmt_shape(x.shape)} {x.dtype}{' (random)' if n not in arrays else ''}"
        for n, x in inputs.items()))
    ort = None
    if by_graph:
        ort = c.float64_outputs(cm.graph, inputs)
        click.echo("check: against lumc's float64 evaluation of the artifact's graph (compiled "
                   "from a PyTorch module: no ONNX model for onnxruntime)" + _eager_note(r))
    elif check:
        ort = c._run_onnxruntime(cm.source_onnx, inputs)
    tol = r.get("tolerance")
    note_atol, how = atol, None
    reduced = r.get("precision", "fp32") != "fp32" or r.get("weights", "same") != "same"
    if ort is not None and reduced and tol and rtol is None and atol is None:
        # a reduced-precision artifact is judged by the tolerance its compile recorded, relative
        # to each output's largest reference magnitude (the quality gate's measure)
        rtol = float(tol)
        atol = {k: rtol * _largest_finite(v) if np.asarray(v).dtype.kind == "f" else 0.0
                for k, v in ort.items()}
        note_atol = None
        how = (f"the compile's tolerance {rtol:g} of each output's largest |reference|; ints "
               "exact but an ArgMax's near-ties")
        click.echo(f"precision {r['precision']} (weights {r.get('weights', 'same')}): judged at "
                   f"the compile's tolerance {rtol:g} of each output's largest |reference|")
    def _ties():   # its index outputs' fp32 scores: near-ties pass, as its quality gate judged
        from lumc.compiler.core.precision_gate import reference_outputs
        return reference_outputs(_judge_graph(cm, reduced, inputs), inputs).ties

    checks = c.print_outputs(outputs, ort, rtol, atol,
                             None if by_graph else
                             lambda: c.float64_outputs(_judge_graph(cm, reduced, inputs), inputs),
                             None if reduced or by_graph else
                             lambda: c._run_onnxruntime_unoptimized(cm.source_onnx, inputs),
                             None if reduced else c.computed_through(cm.graph),
                             _ties if how else None,
                             lambda: c.float64_terms(_judge_graph(cm, reduced, inputs), inputs))
    best = r.get("best_time_s")
    bucket = " (its size bucket's plan, timed at the bucket's largest size)" \
        if getattr(cm, "sized", None) else ""
    click.echo(f"time: run {t1 - t0:.3f} s ({where}); compiled plan "
               + (f"{best * 1e6:.1f} us {'simulated' if cm.simulated else 'measured'} on {cm.device}"
                  f"{bucket}" if best else "untimed"))
    if out_path:
        c._write_npz(out_path, {n: np.asarray(y) for n, y in outputs.items()})
        click.echo(f"wrote {out_path}")
    if check:
        c.finish_check(checks, rtol, note_atol, how,
                       "lumc's float64 evaluation of the artifact's graph" if by_graph else
                       "onnxruntime")
