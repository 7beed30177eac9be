"""``lumc bench`` and ``lumc inspect``: kernel-speed regression checks, rivals, the roofline picture.

    lumc bench m.lumc --json b.json                      # time every kernel and the whole model
    lumc bench m.lumc --compare b.json --max-regression 5%   # exit 1 on a regression
    lumc bench model.onnx --budget 60s --shape x=1x3x64x64 --vs onnxruntime,inductor
    lumc inspect m.lumc --plot roofline.png
    lumc inspect m.lumc --aot cuda:90                      # registers, spills, tensor cores (no GPU)

Registered on the ``lumc`` click group (``lumc.compiler.tools.cli`` imports this module). Errors are one
line and exit status 2 (a ``LumcError`` reaching the group); a regression is exit status 1.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import click

from lumc.compiler.runtime.artifact import (check_writable, looks_like_artifact, model_files,
                                            refuse_same_file, strict_json, write_atomic)
from lumc.compiler.tools.cli import SEED, cli, nonempty_path
from lumc.ir.errors import InputError, LumcError


def is_artifact(path: str) -> bool:
    """A ``.lumc`` file (a zip archive, whole or damaged); an ONNX model is a protobuf, never a zip."""
    return looks_like_artifact(path)


def _check_outputs(inputs: dict, outputs: list) -> None:
    """Refuse, before any measurement, an output path that is one of the command's ``inputs``
    (``{what: path}``) or another output, or that cannot be written."""
    given = [o for o in outputs if o]
    for o in given:
        for what, i in inputs.items():
            for f, w in (model_files(i, what) if i else ()):
                refuse_same_file(o, f, w)
        check_writable(o)
    if len(given) == 2 and os.path.realpath(given[0]) == os.path.realpath(given[1]):
        raise LumcError(f"--json and --plot name the same file {given[0]}; give two paths")


def _check_plot_format(plot_path: str | None) -> None:
    """Refuse, before any compile or measurement, a ``--plot`` whose suffix matplotlib cannot
    write (it failed after the whole bench, with ``--json`` already written)."""
    suffix = pathlib.Path(plot_path).suffix[1:].lower() if plot_path else "png"
    if not plot_path or not suffix:
        return
    from matplotlib.backend_bases import FigureCanvasBase
    known = FigureCanvasBase.get_supported_filetypes()
    if suffix not in known:
        raise LumcError(f"--plot {plot_path}: cannot draw a .{suffix} file; use one of "
                        f"{', '.join(sorted(known))}")


def _plot_atomic(plot_path: str, draw) -> None:
    """``draw(tmp_path)`` renders the chart next to nothing the user has; the bytes are then
    written atomically to ``plot_path`` (its suffix picks the format, as matplotlib does)."""
    suffix = pathlib.Path(plot_path).suffix or ".png"
    with tempfile.TemporaryDirectory(prefix="lumc-plot-") as tmp:
        p = pathlib.Path(tmp) / f"chart{suffix}"
        try:
            draw(str(p))
        except ValueError as e:     # matplotlib: an unknown image format
            raise LumcError(f"--plot {plot_path}: cannot draw it ({e})") from None
        write_atomic(plot_path, p.read_bytes())


def open_target(target: str, *, budget: str, device: str | None, shape_items: tuple, quiet: bool):
    """``(compiled model, artifact hash, compiled here?)`` for a ``.lumc`` artifact or a model.

    A model is compiled first with ``budget`` on ``device``; its artifact hash is the hash it would
    be saved under.
    """
    import lumc
    from lumc import __version__
    from lumc.compiler.runtime.artifact import artifact_hash, load_artifact
    if not os.path.isfile(target):
        raise LumcError(f"{target}: no such file")
    if is_artifact(target):
        from lumc.compiler.runtime.variants import VariantModel
        from lumc.compiler.tools.cli import _parse_shapes
        from lumc.compiler.tools.cli_compile import _pick_variant
        manifest, _ = load_artifact(target, __version__)
        cm = lumc.load(target)
        if isinstance(cm, VariantModel):     # one plan of several: the one --shape names
            cm = _pick_variant(cm, target, _parse_shapes(shape_items), {})
        elif shape_items:
            raise LumcError(f"--shape applies to a model, and {target} is a compiled artifact "
                            "(its shapes are fixed)")
        return cm, artifact_hash(manifest), False
    from lumc.compiler.tools.cli_compile import _model_shapes
    cm = lumc.compile(target, budget=budget, device=device, shapes=_model_shapes(target, shape_items),
                      quiet=quiet)
    with tempfile.TemporaryDirectory(prefix="lumc-bench-") as tmp:
        h = cm.save(os.path.join(tmp, "model.lumc"))
    return cm, h, True


def device_spec_of(name: str):
    """The ceilings to draw for a device name from an artifact (``sim:h200``, ``cuda:0 NVIDIA H100``),
    without needing that GPU here."""
    from lumc.backends.devices import get_device
    if name.startswith("sim:"):
        return get_device(name[4:])
    return get_device("h200" if "H200" in name else "h100-sxm")


# samples per figure a bench may take: 1e5 launches of a 10 us kernel is a second, and of the CPU
# executor minutes; a larger count (--repeats 1e20) would run for ever instead of being refused
MAX_REPEATS = 100_000


def _write_json(path: str, doc: dict) -> None:
    """Strict JSON (``strict_json``): the ratio to a baseline figure of 0 is infinite, written as
    null."""
    write_atomic(path, strict_json(doc))


_BENCH_HELP = """Time every kernel of TARGET and the whole model, on the artifact's device.

TARGET is a .lumc artifact or a model (.onnx), which is compiled first with --budget/--device/--shape.
On a CUDA GPU, kernel times are CUDA-event medians over --repeats launches and the model time is
its CUDA graph replay. On a simulated device (sim:h200) kernel times are the analytical model's
(deterministic), and the CPU executor's wall time is printed, labelled CPU, and never compared.

--compare BASELINE.json exits 1 when a kernel, the end-to-end time, the bytes moved or the kernel
count is worse than the baseline by more than --max-regression (5% by default), after re-measuring
suspected regressions, and prints kernel | baseline | now | ratio. Kernels match by hash, else by
position and form; missing or new kernels are reported, not failed. A baseline from another device,
model or input shapes is refused (exit 2), and so is a malformed one (a missing field, a time that
is not a finite number >= 0, a kernel row given twice). A baseline at another --precision or
--weights (or one that does not record them) times other arithmetic: the comparison says so
(precision differs: baseline fp32 (weights same), this bf16 (weights same)) and exits 1 unless
--allow-precision-change is given.

--json and --plot are written atomically (missing folders are created); neither may be TARGET or
the baseline.

--vs eager,inductor,onnxruntime runs those rivals in this process on the same inputs and prints
time ratios; on the CPU also Inductor's kernel count and bytes accessed beside lumc's.
"""


@cli.command("bench", help=_BENCH_HELP)
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--json", "json_out", type=click.Path(dir_okay=False), metavar="OUT.json",
              callback=nonempty_path,
              help="Write the bench document (device, versions, artifact hash, per-kernel and "
                   "end-to-end figures).")
@click.option("--compare", "baseline", type=click.Path(dir_okay=False), metavar="BASELINE.json",
              help="Check against a baseline written by --json; exit 1 on a regression.")
@click.option("--max-regression", default="5%", show_default=True, metavar="PCT",
              help="Allowed slowdown per figure, e.g. 5% or 0.05.")
@click.option("--allow-precision-change", "allow_precision_change", is_flag=True,
              help="With --compare: compare against a baseline at another precision or weights "
                   "(or one that does not record them) instead of failing (exit 1).")
@click.option("--repeats", type=click.IntRange(min=1, max=MAX_REPEATS), default=None, metavar="N",
              help="Samples per figure (default: 25 per kernel on a GPU; 5 CPU-executor calls; "
                   f"at most {MAX_REPEATS:,}).")
@click.option("--vs", "vs", default=None, metavar="RIVALS",
              help="Comma list of eager, inductor, onnxruntime (or all).")
@click.option("--budget", default="60s", show_default=True, help="Compile budget when TARGET is a model.")
@click.option("--device", default=None, help="cuda[:N], sim:h100 or sim:h200 (default: the artifact's).")
@click.option("--shape", "shape_items", multiple=True, metavar="NAME=DxD...",
              help="Input shape or dynamic dim when TARGET is a model, or the size to time "
                   "of an artifact compiled for several sizes or size ranges (repeatable).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="OUT.png",
              callback=nonempty_path,
              help="Also draw the roofline chart of these times.")
@click.option("--threads", type=click.IntRange(min=1), default=None, metavar="N",
              help="CPU threads of the torch and onnxruntime rivals (default: theirs).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the random inputs (>= 0).")
@click.option("--quiet", is_flag=True, help="No compile progress display.")
def bench_cmd(target, json_out, baseline, max_regression, allow_precision_change, repeats, vs,
              budget, device, shape_items, plot_path, threads, seed, quiet):
    from lumc.compiler.tools.bench import (Bencher, bench_compiled, bench_inputs, bench_summary,
                                     bench_target, model_identity)
    from lumc.compiler.tools.compare import check_comparable, compare_docs, load_baseline, parse_threshold
    from lumc.compiler.tools.rivals import parse_rivals, rivals_table, run_rivals

    threshold = parse_threshold(max_regression)
    if allow_precision_change and not baseline:
        raise InputError("--allow-precision-change applies to a comparison; add --compare "
                         "BASELINE.json")
    rivals = parse_rivals(vs) if vs else []
    _check_outputs({"the target": target, "the baseline": baseline}, [json_out, plot_path])
    _check_plot_format(plot_path)
    base = load_baseline(baseline) if baseline else None
    cm, ahash, compiled = open_target(target, budget=budget, device=device, shape_items=shape_items,
                                      quiet=quiet)
    tgt = bench_target(cm, None if compiled else device)
    if base is not None:   # refuse a foreign baseline before spending time on measurements
        check_comparable(base, {"device": tgt.name, "model": model_identity(cm)}, f"baseline {baseline}")
    bencher = Bencher(cm, tgt, bench_inputs(cm, seed))
    doc = bench_compiled(cm, repeats=repeats, artifact_hash=ahash, bencher=bencher)
    click.echo(bench_summary(doc))

    if rivals:
        if tgt.simulated:
            lumc_t, where, how = doc["wall"]["time_s"], "cpu", "CPU executor"
            click.echo("\nside by side on the CPU (lumc: its CPU executor; its simulated "
                       f"{tgt.spec.name} times are not comparable with CPU rivals):")
        else:
            lumc_t, where, how = doc["end_to_end"]["time_s"], tgt.torch_device, doc["end_to_end"]["how"]
            click.echo(f"\nside by side on {tgt.name}:")
        rows = run_rivals(cm, rivals, bencher.inputs, lumc_t, where,
                          "cpu" if tgt.simulated else tgt.torch_device, repeats or 10, threads, how)
        click.echo(rivals_table(rows, doc["end_to_end"].get("ideal_bytes")))
        doc["rivals"] = [r.as_dict() for r in rows]

    cmp = None
    if base is not None:
        n2 = max(2 * (repeats or doc["repeats"]), 10)

        def remeasure(indices, model):
            import statistics
            ks = {i: statistics.median(bencher.kernel_samples(i, n2)) for i in indices}
            t = None
            if model:
                times = [statistics.median(bencher.kernel_samples(i, n2)) for i in
                         range(len(cm.program.calls))] if tgt.simulated else []
                t = statistics.median(bencher.device_samples(times, n2)[0])
            return {"kernels": ks, "model": t}

        cmp = compare_docs(base, doc, threshold, remeasure, name=f"baseline {baseline}",
                           allow_precision_change=allow_precision_change)
        sim = f"; times simulated on {tgt.name}" if tgt.simulated else ""
        click.echo(f"\ncompare against {baseline} (max regression {100 * threshold:g}%{sim}):")
        click.echo(cmp.table())
        doc["comparison"] = {"baseline": str(baseline), "threshold": threshold, "ok": cmp.ok,
                             "regressions": [r.label for r in cmp.regressions],
                             "precision_change": cmp.precision_change,
                             "rows": [{**r.__dict__, "ratio": r.ratio} for r in cmp.rows],
                             "notes": cmp.notes}
    if json_out:
        _write_json(json_out, doc)
        click.echo(f"wrote {json_out}")
    if plot_path:
        from lumc.compiler.tools.roofline_plot import plot_roofline
        _plot_atomic(plot_path, lambda p: plot_roofline(
            doc["kernels"], tgt.spec, p, simulated=tgt.simulated,
            title=f"lumc bench: {doc['model']['name']} on {tgt.name}"))
        click.echo(f"wrote {plot_path}")
    if cmp is not None and not cmp.ok:
        sys.exit(1)


@cli.command("inspect")
@click.argument("artifact", type=click.Path(dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="OUT.png",
              callback=nonempty_path,
              help="Draw every kernel on the device's roofline (PNG).")
@click.option("--aot", "aot_target", default=None, metavar="cuda:90",
              help="Also compile every kernel ahead of time for this GPU (no GPU needed) and print "
                   "registers, spills, stack and shared memory (ptxas -v) and the tensor-core "
                   "instructions of its SASS.")
@click.option("--why-not", "why_not", is_flag=True,
              help="For each value one kernel writes and another reads, say why the two are not "
                   "one kernel: the fusion decision, the e-graph rule that would be needed, and "
                   "the candidates with fewer kernels and the bound they lost by.")
def inspect_cmd(artifact, plot_path, aot_target, why_not=False):
    """Print the per-kernel table of a compiled ARTIFACT and draw its roofline chart."""
    import lumc
    from lumc import __version__
    from lumc.compiler.runtime.artifact import artifact_hash, load_artifact
    from lumc.compiler.tools.bench import kernel_table

    if not os.path.isfile(artifact):
        raise LumcError(f"{artifact}: no such file")
    if not is_artifact(artifact):
        raise LumcError(f"{artifact}: not a .lumc artifact; compile the model first "
                        "(lumc compile MODEL -o OUT.lumc), or use lumc bench on it")
    _check_outputs({"the artifact": artifact}, [plot_path])
    _check_plot_format(plot_path)
    if aot_target is not None:
        from lumc.compiler.tools.aot_inspect import check_aot_target
        aot_target = check_aot_target(aot_target)
    manifest, _ = load_artifact(artifact, __version__)
    loaded = lumc.load(artifact, device="cpu")
    from lumc.compiler.runtime.variants import VariantModel
    plans = loaded.representatives() if isinstance(loaded, VariantModel) else [(None, loaded)]
    if plot_path and len(plans) > 1:    # refused before anything is printed, not skipped (exit 0)
        raise InputError(f"--plot draws one plan, and {artifact} holds {len(plans)} (one per size "
                         f"or size range); draw one with lumc bench {artifact} --shape DIM=N "
                         f"--plot {plot_path}")
    for desc, cm in plans:
        if desc is not None:
            click.echo(f"== plan {desc}")
        _inspect_one(cm, artifact, manifest, plot_path if desc is None else None, aot_target,
                     why_not)


def _inspect_one(cm, artifact, manifest, plot_path, aot_target, why_not):
    """``lumc inspect`` of one plan (see :func:`inspect_cmd`)."""
    from lumc.compiler.runtime.artifact import artifact_hash
    from lumc.compiler.tools.bench import kernel_table
    r = cm.report_dict()
    rows = [{"index": i, **k} for i, k in enumerate(r.get("per_kernel", []))]
    unit = "simulated" if cm.simulated else "measured"
    click.echo(f"{artifact}: {r.get('model', 'model')}, lumc {manifest.get('lumc_version')}, "
               f"artifact {artifact_hash(manifest)[:12]}")
    click.echo("inputs: " + ", ".join(repr(i) for i in cm.inputs) + "; outputs: "
               + ", ".join(repr(o) for o in cm.outputs))
    if r.get("fast_math"):
        click.echo("fast math: compiled with --fast-math (rewrites that change results, such as "
                   "a / b as a * (1 / b), were allowed)")
    click.echo(kernel_table(rows, f"{len(rows)} kernel{'s' * (len(rows) != 1)} on {cm.device} "
                                   f"({unit} times at compile)"))
    bt, bd = r.get("best_time_s"), r.get("bound_time_s")
    ideal, moved = r.get("ideal_bytes"), r.get("bytes_moved")
    line = "total: " + (f"{bt * 1e6:.2f} us" if bt is not None else "untimed")
    if bd:
        line += f", bound {bd * 1e6:.2f} us" + (f" ({100 * bd / bt:.1f}% of it; the bound is each kernel's roofline "
                                                  "plus its launch)" if bt else "")
    if moved is not None and ideal:
        line += f", {moved / 1e6:.3f} MB moved ({moved / ideal:.2f}x ideal {ideal / 1e6:.3f} MB"
        from lumc.compiler.runtime.report_text import workspace_text
        line += workspace_text(r, 3) + ")"
    click.echo(line)
    if r.get("precision") is not None:
        click.echo(f"precision {r.get('precision')}, weights {r.get('weights')}")
    from lumc.compiler.runtime.report_text import quality_line, user_notes
    if quality_line(r):     # the quality the compile measured, as its summary said it
        click.echo(quality_line(r))
    for w in user_notes(r):
        click.echo(f"note: {w}")
    if r.get("candidates_total") is not None:
        from lumc.compiler.runtime.report_text import search_text
        click.echo(f"search: {search_text(r)}; stopped: {r.get('stopped_because')}; compile "
                   f"{r.get('compile_s', 0):.1f} s")
    if why_not:
        from lumc.compiler.core.why_not import why_not_lines
        doc = r.get("why_not")
        if doc is None:
            click.echo("why not: this artifact records no fusion decisions (compiled before "
                       "--why-not existed); compile it again")
        else:
            click.echo(f"why not ({len(doc.get('pairs', []))} producer -> consumer pairs):")
            for line in why_not_lines(doc):
                click.echo("  " + line)
    if plot_path:
        from lumc.compiler.tools.roofline_plot import plot_roofline
        dtypes = {v[1] for v in (r.get("inputs") or {}).values() if v[1].startswith(("f", "bf"))}
        _plot_atomic(plot_path, lambda p: plot_roofline(
            rows, device_spec_of(cm.device), p, simulated=cm.simulated,
            title=f"lumc: {r.get('model', 'model')} on {cm.device}", dtypes=dtypes or None))
        click.echo(f"wrote {plot_path}")
    if aot_target is not None:
        from lumc.compiler.tools.aot_inspect import aot_rows, aot_summary, format_aot_table
        arows = aot_rows(cm, aot_target)
        click.echo(format_aot_table(arows, f"ahead-of-time compile for {aot_target} (Triton "
                                           "-> ptxas, no GPU; registers/spills per thread)"))
        click.echo(aot_summary(arows))
