"""Views: zero-copy movement of tensors as index expressions.

A :class:`View` maps every index of an output shape to a position in its source tensor's flat,
contiguous (row-major) element space::

    flat(i_0..i_{n-1}) = offset + sum_k i_k * strides[k]
    valid(i)           = all_k  mask[k][0] <= i_k < mask[k][1]       (mask None: always valid)

Where ``valid`` is false the element reads as zero (of the source dtype); padding is a mask. Reshape,
permute, expand (stride 0), slice with any step (negative too), pad and sliding windows are all views.
A reshape that cannot be expressed on top of an existing view (a merge of non-mergeable strides, or a
masked view) returns ``None``; the graph then stacks a second view on the first (like tinygrad's
ShapeTracker), and :func:`stacked_index_expr` composes them into one index expression.

Zero-size dims are allowed anywhere: a view with a zero in its shape has no elements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Shape = tuple[int, ...]


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """Row-major strides, in elements, of a contiguous tensor of ``shape`` (size-1 dims get 0)."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc if d != 1 else 0)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def prod(xs) -> int:
    return math.prod(xs)


@dataclass(frozen=True)
class View:
    """An affine, masked view of a flat source (see module docstring).

    Attributes:
        shape: output shape.
        strides: elements to step in the source per unit of each output dim (0 = broadcast).
        offset: flat source position of index (0, ..., 0) (may lie outside when masked).
        mask: per-dim valid ranges ``(lo, hi)``, or None when every index is valid.
    """
    shape: Shape
    strides: tuple[int, ...]
    offset: int = 0
    mask: tuple[tuple[int, int], ...] | None = None

    # ---- construction -------------------------------------------------------------------------
    @staticmethod
    def contiguous(shape: Shape) -> "View":
        shape = tuple(int(d) for d in shape)
        return View(shape, contiguous_strides(shape), 0, None)

    @staticmethod
    def _make(shape, strides, offset, mask) -> "View":
        shape = tuple(int(s) for s in shape)
        strides = tuple(0 if d == 1 else int(s) for d, s in zip(shape, strides))
        if mask is not None:
            mask = tuple((max(0, min(lo, d)), max(0, min(hi, d))) for (lo, hi), d in zip(mask, shape))
            if any(lo >= hi for lo, hi in mask) and prod(shape) > 0:
                # nothing valid: every element reads zero; keep a canonical empty mask
                mask = tuple((0, 0) for _ in shape)
            elif all(lo == 0 and hi == d for (lo, hi), d in zip(mask, shape)):
                mask = None
        return View(shape, strides, int(offset), mask)

    # ---- properties ---------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return self.offset == 0 and self.mask is None and self.strides == contiguous_strides(self.shape)

    def is_identity_of(self, src_shape: Shape) -> bool:
        """True when the view reads ``src_shape`` unchanged (no movement at all)."""
        return self.is_contiguous and tuple(self.shape) == tuple(src_shape)

    # ---- movement -----------------------------------------------------------------------------
    def permute(self, perm: tuple[int, ...]) -> "View":
        assert sorted(perm) == list(range(self.ndim)), f"bad permutation {perm} for rank {self.ndim}"
        mask = None if self.mask is None else tuple(self.mask[p] for p in perm)
        return View._make(tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm),
                          self.offset, mask)

    def expand(self, shape: Shape) -> "View":
        """Broadcast size-1 dims to ``shape`` (stride 0)."""
        assert len(shape) == self.ndim, (shape, self.shape)
        for s, n in zip(self.shape, shape):
            assert s == n or s == 1, f"cannot expand {self.shape} to {shape}"
        mask = None
        if self.mask is not None:
            mask = tuple(m if s == n else ((0, n) if m[0] < m[1] else (0, 0))
                         for m, s, n in zip(self.mask, self.shape, shape))
        strides = tuple(st if s == n else 0 for st, s, n in zip(self.strides, self.shape, shape))
        return View._make(shape, strides, self.offset, mask)

    def slice(self, starts, steps, counts) -> "View":
        """Per dim: element ``j`` of the result is element ``starts[k] + j * steps[k]`` of this view.

        ``steps`` may be negative (then ``starts`` is the first, highest index). ``counts`` gives the
        output length of each dim; indices must be in range for the unmasked region.
        """
        offset = self.offset
        strides, mask = [], []
        for k in range(self.ndim):
            a, s, c = int(starts[k]), int(steps[k]), int(counts[k])
            assert s != 0
            offset += a * self.strides[k] if c > 0 else 0
            strides.append(self.strides[k] * s)
            lo, hi = (0, self.shape[k]) if self.mask is None else self.mask[k]
            if s > 0:
                jlo, jhi = -((a - lo) // s), -((a - hi) // s)       # ceil((lo-a)/s), ceil((hi-a)/s)
            else:
                t = -s
                jlo, jhi = (a - hi) // t + 1, (a - lo) // t + 1
            mask.append((max(jlo, 0), min(jhi, c)))
        return View._make(tuple(int(c) for c in counts), strides, offset, tuple(mask))

    def pad(self, pads) -> "View":
        """``pads[k] = (before, after)``, both >= 0; the padded region reads zero."""
        offset, mask, shape = self.offset, [], []
        for k, (b, a) in enumerate(pads):
            assert b >= 0 and a >= 0, "negative pads are slices"
            offset -= b * self.strides[k]
            lo, hi = (0, self.shape[k]) if self.mask is None else self.mask[k]
            mask.append((lo + b, hi + b))
            shape.append(self.shape[k] + b + a)
        return View._make(shape, self.strides, offset, tuple(mask))

    def window(self, axis: int, size: int, stride: int, dilation: int, count: int) -> "View | None":
        """Sliding windows along ``axis``: replace it by ``(count, size)`` dims where element
        ``(o, k)`` is element ``o * stride + k * dilation`` of that axis. None if this view is masked
        along ``axis`` (the mask would not be a box); stack a new view instead."""
        if self.mask is not None and self.mask[axis] != (0, self.shape[axis]):
            return None
        st = self.strides[axis]
        shape = self.shape[:axis] + (count, size) + self.shape[axis + 1:]
        strides = self.strides[:axis] + (st * stride, st * dilation) + self.strides[axis + 1:]
        mask = None
        if self.mask is not None:
            mask = self.mask[:axis] + ((0, count), (0, size)) + self.mask[axis + 1:]
        return View._make(shape, strides, self.offset, mask)

    def reshape(self, new_shape: Shape) -> "View | None":
        """The same elements in row-major order with a new shape, or None if that is not one view."""
        new_shape = tuple(int(d) for d in new_shape)
        assert prod(new_shape) == self.numel, f"cannot reshape {self.shape} to {new_shape}"
        if new_shape == self.shape:
            return self
        if self.numel == 0:
            return View.contiguous(new_shape) if self.mask is None else None
        if self.mask is not None:
            # only size-1 dims may come and go under a mask
            if [d for d in self.shape if d != 1] != [d for d in new_shape if d != 1]:
                return None
            kept = [(d, st, m) for d, st, m in zip(self.shape, self.strides, self.mask) if d != 1]
            if any(d == 1 and m != (0, 1) for d, m in zip(self.shape, self.mask)):
                return None  # a size-1 dim that is masked out cannot vanish
            it = iter(kept)
            strides, mask = [], []
            for d in new_shape:
                if d == 1:
                    strides.append(0)
                    mask.append((0, 1))
                else:
                    _, st, m = next(it)
                    strides.append(st)
                    mask.append(m)
            return View._make(new_shape, strides, self.offset, mask)
        # unmasked: numpy's no-copy reshape (merge/split runs of dims with compatible strides)
        old = [(d, s) for d, s in zip(self.shape, self.strides) if d != 1]
        new = [d for d in new_shape]
        strides_out = [0] * len(new)
        oi, ni = 0, 0
        nonone_new = [i for i, d in enumerate(new) if d != 1]
        j = 0
        while oi < len(old) and j < len(nonone_new):
            # grow a group of old dims and new dims with equal products
            o_end, n_end = oi + 1, j + 1
            po, pn = old[oi][0], new[nonone_new[j]]
            while po != pn:
                if po < pn:
                    po *= old[o_end][0]
                    o_end += 1
                else:
                    pn *= new[nonone_new[n_end]]
                    n_end += 1
            # old dims in the group must be mergeable: stride[k] == stride[k+1] * dim[k+1]
            for k in range(oi, o_end - 1):
                if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                    return None
            st = old[o_end - 1][1]
            for t in range(n_end - 1, j - 1, -1):
                strides_out[nonone_new[t]] = st
                st *= new[nonone_new[t]]
            oi, j = o_end, n_end
        return View._make(new_shape, strides_out, self.offset, None)

    # ---- index expressions ----------------------------------------------------------------------
    def index_expr(self, idx: list[str]) -> tuple[str, str | None]:
        """Render ``(flat_index, valid)`` as expressions over the output index names ``idx``.

        ``valid`` is None when every index is valid. The expressions use ``+ * < <= and`` only, so
        they are valid in both Python/numpy and Triton source (with ``&`` joined masks by the caller).
        """
        terms = [str(self.offset)] if self.offset else []
        for name, st in zip(idx, self.strides):
            if st == 1:
                terms.append(name)
            elif st != 0:
                terms.append(f"{name} * {st}")
        flat = " + ".join(terms) if terms else "0"
        valid = None
        if self.mask is not None:
            conds = []
            for name, (lo, hi), d in zip(idx, self.mask, self.shape):
                if lo > 0:
                    conds.append(f"({name} >= {lo})")
                if hi < d:
                    conds.append(f"({name} < {hi})")
            if any(lo >= hi for lo, hi in self.mask):
                conds = ["False"]
            valid = " & ".join(conds) if conds else None
        return flat, valid


def unravel_expr(flat: str, shape: Shape) -> list[str]:
    """Row-major indices of ``shape`` from a flat index expression (``(flat // s) % d`` per dim)."""
    out, acc = [], 1
    for d in reversed(shape):
        if d == 1:
            out.append("0")
        else:
            e = f"({flat})" if acc == 1 else f"(({flat}) // {acc})"
            out.append(f"({e} % {d})")
        acc *= d
    return list(reversed(out))


def stacked_index_expr(views: list[View], idx: list[str]) -> tuple[str, list[str]]:
    """Compose a stack of views (outermost last) into ``(flat source index, [valid conditions])``.

    ``views[0]`` reads the real source; ``views[i]`` reads the contiguous index space of
    ``views[i-1]``'s shape.
    """
    conds: list[str] = []
    cur_idx = idx
    for i in range(len(views) - 1, -1, -1):
        flat, valid = views[i].index_expr(cur_idx)
        if valid is not None:
            conds.append(valid)
        if i > 0:
            cur_idx = unravel_expr(flat, views[i - 1].shape)
        else:
            return flat, conds
    return "0", conds
