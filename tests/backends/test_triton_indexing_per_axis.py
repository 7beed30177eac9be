"""Per-axis view coordinates (``indexing.per_axis``): a view's source coordinates read off its
strides, checked against unravelling its flat position at every valid index of random views
(windows, pads, slices with negative steps, permutes, broadcasts), and the conv kernels that use
them against the reference."""
import itertools

import numpy as np
from hypothesis import given, settings, strategies as st

from lumc.backends.triton.indexing import per_axis
from lumc.ir import dtypes as dt
from lumc.ir.library.conv import conv
from lumc.ir.views import View
from triton_cases import check, make_kernel


def _valid_points(v: View):
    box = v.mask or tuple((0, d) for d in v.shape)
    return itertools.product(*(range(lo, hi) for lo, hi in box))


def _agrees(v: View, src_shape) -> bool:
    pa = per_axis(v, src_shape)
    if pa is None:
        return False
    for p in _valid_points(v):
        flat = v.offset + sum(i * s for i, s in zip(p, v.strides))
        want = np.unravel_index(flat, src_shape) if 0 <= flat < int(np.prod(src_shape)) else None
        got = tuple(off + sum(m * p[j] for j, m in terms) for off, terms in pa)
        assert want is not None and tuple(int(x) for x in want) == got, (v, src_shape, p)
    return True


def test_conv_windows_over_padded_input_decompose():
    # the padded [1, 4, 10, 9] space read as [N, C, oh, kh, ow, kw] windows, stride 2, dilation 1
    padded = (1, 4, 10, 9)
    v = View.contiguous(padded).window(2, 3, 2, 1, 4)
    v = v.window(4, 3, 1, 1, 7)
    assert _agrees(v, padded)
    pa = per_axis(v, padded)
    assert [t for _, t in pa][2] == [(2, 2), (3, 1)]       # oh * 2 + kh along the rows


def test_a_reshape_that_carries_is_refused():
    # [6] read as [2, 3] over a source [3, 2]: position 3 is (1, 1) in the source, not a per-axis sum
    v = View((2, 3), (3, 1), 0, None)
    assert per_axis(v, (3, 2)) is None


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_views_decompose_exactly_or_not_at_all(data):
    rank = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    v = View.contiguous(shape)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["pad", "window", "slice", "permute", "expand"]))
        if kind == "pad":
            nv = v.pad([(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in v.shape])
        elif kind == "window":
            ax = data.draw(st.integers(0, v.ndim - 1))
            k = data.draw(st.integers(1, max(1, v.shape[ax])))
            s = data.draw(st.integers(1, 2))
            count = (v.shape[ax] - k) // s + 1
            nv = v.window(ax, k, s, 1, count)
        elif kind == "slice":
            starts, steps, counts = [], [], []
            for d in v.shape:
                step = data.draw(st.sampled_from([1, 2, -1]))
                start = d - 1 if step < 0 else data.draw(st.integers(0, d - 1))
                cnt = len(range(start, -1 if step < 0 else d, step))
                starts.append(start), steps.append(step), counts.append(cnt)
            nv = v.slice(starts, steps, counts)
        elif kind == "permute":
            nv = v.permute(tuple(data.draw(st.permutations(range(v.ndim)))))
        else:
            nv = View(tuple(v.shape) + (3,), tuple(v.strides) + (0,), v.offset,
                      None if v.mask is None else tuple(v.mask) + ((0, 3),))
        if nv is not None and nv.numel > 0 and nv.numel <= 4096:
            v = nv
    # the views above all read the contiguous source of ``shape``: decomposition is always exact
    # where it exists, and it exists for everything but carries
    src_flat = int(np.prod(shape))
    if any(0 > v.offset + sum(i * s for i, s in zip(p, v.strides)) or
           v.offset + sum(i * s for i, s in zip(p, v.strides)) >= src_flat for p in _valid_points(v)):
        return
    assert _agrees(v, shape) or per_axis(v, shape) is None


def test_conv_kernels_read_windows_without_div_mod_of_the_flat_position():
    k = make_kernel("matmul", lambda x, w: conv(x, w, pads=[1, 2, 2, 1], strides=[2, 1],
                                                dilations=[1, 2]),
                    [((2, 3, 11, 9), dt.f32), ((5, 3, 3, 3), dt.f32)])
    tk = check(k)
    src = tk.source
    loop = src[src.index("for k_start"):]
    # the window view's source coordinates are sums of output and tap indices; only K is unravelled
    assert "am0 = " not in loop and "f0 = " not in loop
