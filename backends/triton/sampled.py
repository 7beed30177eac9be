"""A numerics check of a large kernel on a sample of its programs, in Triton's CPU interpreter.

The interpreter runs a kernel's programs one after another in numpy: a 224x224 convolution's
matmul has hundreds of programs and takes 5-10 s to check, so a ResNet-50 on ``sim:*`` spent its
whole budget in checks. Every program of a generated kernel runs the same code on another tile;
what differs between them is the tile's offsets, its masks (the last tile of a ragged axis) and the
group swizzle that maps a program id to a tile. :func:`run_sampled` therefore runs, of a grid of
more than :data:`SAMPLE_ABOVE` programs, the corners of the grid (the first and last program along
each axis, so every ragged edge and the last swizzle group), the programs next to them, and a
seeded draw of the rest, :data:`SAMPLE` in all, and says which output elements they wrote.

Which elements a program wrote is found without knowing its tile: the sampled programs run over
outputs filled with a sentinel, and an element that no longer holds it was written: for f16, bf16,
f32 and f64 a NaN whose payload no arithmetic makes (0x7DA5, 0x7FA5, 0x7FA5A5A5,
0x7FF5A5A5A5A5A5A5: an arithmetic NaN is the quiet one with an empty payload); for wider integers
the byte ``0xA5`` repeated. A written element equal to the sentinel would be taken as unwritten
and judged equal to the reference: a wrong value would have to be exactly that number. A kernel
with a one-byte output (bool, int8, uint8, fp8: every byte is a value) runs twice instead, over
zero bytes and over ones: an element whose bytes agree between the runs was written (a kernel is
deterministic: no atomics). The caller compares the written elements with the reference and takes
the reference's values for the rest (``lumc.compiler.core.measure``).

A kernel with more than one launch (a split-K reduction reading its partials) is run whole: a
later launch reads what unsampled programs of the first would have written. So is one whose
sample left an output's first or last element unwritten: the first and last programs always run,
and in the tile orders lumc generates they write those corners, so an edge written short (a mask
one row too tight), or a tile order the sample cannot judge, is judged by the whole run.

The interpreter's grid set-up is wrapped once, in the process that runs a check; it samples only a
launch from the thread of a running :func:`run_sampled` (one at a time: the interpreter's grid
state is a module global). A GPU check never samples.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from math import prod

import numpy as np

SAMPLE_ABOVE = 64     # a grid of at most this many programs runs whole
SAMPLE = 32           # programs run of a larger grid

_LOCK = threading.Lock()


class _Sampler:
    """Picks the programs of each launch's grid and maps the interpreter's loop onto them."""

    def __init__(self, seed: int):
        self.seed = seed
        self.real: tuple[int, int, int] | None = None
        self.picked: list[tuple[int, int, int]] = []
        self.ran = 0
        self.total = 0
        self.launches = 0

    def wrap(self, grid):
        def resolved(args):
            g = grid(args) if callable(grid) else grid
            g = tuple(int(v) for v in g) + (1,) * (3 - len(g))
            n = prod(g)
            self.total += n
            self.launches += 1
            if n <= SAMPLE_ABOVE:
                self.real, self.picked = None, []
                self.ran += n
                return g
            self.real, self.picked = g, pick_programs(g, SAMPLE, self.seed)
            self.ran += len(self.picked)
            return (len(self.picked), 1, 1)
        return resolved


def pick_programs(grid: tuple[int, int, int], n: int, seed: int) -> list[tuple[int, int, int]]:
    """About ``n`` program ids ``(x, y, z)`` of ``grid`` in the interpreter's loop order: every
    corner (first and last along each axis), the programs next to the first and last ones, then a
    draw seeded by ``seed`` of the rest. Ids are unique; fewer than ``n`` only for a small grid."""
    gx, gy, gz = grid
    total = gx * gy * gz
    lin = set()
    for x in {0, gx - 1}:
        for y in {0, gy - 1}:
            for z in {0, gz - 1}:
                lin.add((x * gy + y) * gz + z)
    lin |= {i for i in (1, 2, total - 2, total - 3) if 0 <= i < total}
    rest = n - len(lin)
    if rest > 0:
        draw = np.random.default_rng(seed).choice(total, size=min(total, rest + len(lin)),
                                                  replace=False)
        for i in draw.tolist():
            if len(lin) >= n:
                break
            lin.add(int(i))
    return [(i // (gy * gz), (i // gz) % gy, i % gz) for i in sorted(lin)]


_ACTIVE: dict[int, _Sampler] = {}     # thread id -> the sampler of its running check
_INSTALLED = False


def _install() -> None:
    """Wrap the interpreter's grid set-up once, for good: a launch from a thread with an active
    sampler runs that sampler's programs; every other launch runs as before (so nothing is left
    patched half-way by a signal, and another thread's launch is never sampled)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from triton.runtime import interpreter as itp
    b = itp.interpreter_builder
    init, set_dim, set_idx = itp.GridExecutor.__init__, b.set_grid_dim, b.set_grid_idx

    def grid_init(self, fn, arg_names, grid, *args, **kwargs):
        s = _ACTIVE.get(threading.get_ident())
        init(self, fn, arg_names, grid if s is None else s.wrap(grid), *args, **kwargs)

    def grid_dim(nx, ny, nz):
        s = _ACTIVE.get(threading.get_ident())
        set_dim(*((s.real if s is not None else None) or (nx, ny, nz)))

    def grid_idx(x, y, z):
        s = _ACTIVE.get(threading.get_ident())
        set_idx(*(s.picked[x] if s is not None and s.real else (x, y, z)))

    itp.GridExecutor.__init__ = grid_init
    b.set_grid_dim, b.set_grid_idx = grid_dim, grid_idx
    _INSTALLED = True


@contextmanager
def _sampling(sampler: _Sampler):
    with _LOCK:     # one sampled run at a time: the interpreter's grid state is a module global
        _install()
        me = threading.get_ident()
        try:
            _ACTIVE[me] = sampler
            yield
        finally:
            _ACTIVE.pop(me, None)


SENTINEL = 0xA5


_NAN_BITS = {"float16": 0x7DA5, "bfloat16": 0x7FA5, "float32": 0x7FA5A5A5,
             "float64": 0x7FF5A5A5A5A5A5A5}     # NaNs with a payload, by torch dtype name


def _filled(shape, dtype, byte: int):
    """A tensor of ``shape`` filled with ``byte`` (the :data:`SENTINEL`: a float's NaN pattern)."""
    import torch
    o = torch.empty(shape, dtype=dtype)
    name = str(dtype).replace("torch.", "")
    if dtype == torch.bool:
        o.fill_(bool(byte))
    elif o.numel() and byte == SENTINEL and name in _NAN_BITS:
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[o.element_size()]
        o.view(ints).fill_(_NAN_BITS[name])
    elif o.numel():
        o.view(torch.uint8).fill_(byte)
    return o


def _bytes(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes, one row per element (shape ``a.shape + (itemsize,)``)."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (a.dtype.itemsize,))


def run_sampled(tk, ins: list, config) -> tuple[list[np.ndarray], list[np.ndarray] | None, str]:
    """Run Triton kernel ``tk`` (a :class:`~lumc.backends.triton.launch.TritonKernel` in the
    interpreter) on ``ins`` at ``config``, whole or on a sample of its programs.

    Returns:
        ``(outputs, written, note)``: the output arrays (numpy, in ``out0, out1, ...`` order);
        ``written``, None where every program ran, else one bool array per output, True where a
        sampled program wrote the element (elsewhere the output holds no value); ``note``: ""
        or ``"on K of N programs"``.
    Raises:
        whatever the launch raises (a kernel error, an :class:`InputError` on wrong inputs).
    """
    import torch

    from lumc.backends.triton.launch import to_numpy, torch_dtype
    if not tk.interpret:
        return [to_numpy(o) for o in tk(*ins, config=config)], None, ""
    dtypes = [torch_dtype(p.dtype) for p in tk.rendered.outputs]
    one_byte = any(d.itemsize == 1 for d in dtypes)
    fills = (0, 1) if one_byte else (SENTINEL,)     # a byte-wide sentinel is a value too
    runs = []
    sampler = None
    for byte in fills:
        outs = [_filled(tuple(p.shape), d, byte) for p, d in zip(tk.rendered.outputs, dtypes)]
        sampler = _Sampler(seed=int(tk.rendered.name.encode().hex()[-8:], 16))
        with _sampling(sampler):
            got = tk(*ins, outputs=outs, config=config)
        runs.append([to_numpy(o) for o in got])
        if sampler.ran == sampler.total:        # no grid was sampled: the first run is whole
            return runs[0], None, ""
        if sampler.launches > 1:      # a later launch reads what the first wrote: run it whole
            return [to_numpy(o) for o in tk(*ins, config=config)], None, ""
    if len(runs) == 1:
        marks = [_bytes(to_numpy(_filled((1,), d, SENTINEL)))[0] for d in dtypes]
        written = [(_bytes(a) != m).any(axis=-1) if a.size else np.zeros(a.shape, bool)
                   for a, m in zip(runs[0], marks)]
    else:
        written = [(_bytes(a) == _bytes(b)).all(axis=-1) if a.size else np.zeros(a.shape, bool)
                   for a, b in zip(*runs)]
    if any(w.size and not (w.reshape(-1)[0] and w.reshape(-1)[-1]) for w in written):
        # the first and last programs always run and write an output's first and last elements
        # (its corners): one left unwritten is a kernel that writes too little at an edge, or a
        # tile order the sample cannot judge; the whole run judges every element
        return [to_numpy(o) for o in tk(*ins, config=config)], None, ""
    return runs[0], written, f"on {sampler.ran} of {sampler.total} programs"
