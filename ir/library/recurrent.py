"""Recurrent layers (ONNX ``LSTM``, ``GRU``, ``RNN``) unrolled over the static sequence length.

The input projection ``X @ W^T`` of every step is one contraction over the whole sequence; each step
then adds ``H_{t-1} @ R^T`` and applies the gate activations, all from primitives. Shapes
(``layout = 0``; ``layout = 1`` swaps the first two dims of X, initial_h/c, Y, Y_h, Y_c):

    X [seq, batch, input]   W [dirs, gates*hidden, input]   R [dirs, gates*hidden, hidden]
    B [dirs, 2*gates*hidden] (W biases then R biases)   sequence_lens [batch] (i32)
    initial_h, initial_c [dirs, batch, hidden]   P [dirs, 3*hidden] (LSTM peepholes, order i o f)
    Y [seq, dirs, batch, hidden]   Y_h, Y_c [dirs, batch, hidden]

Gate order in W, R, B: LSTM ``i o f c``, GRU ``z r h``. ``dirs`` is 2 for ``bidirectional`` and 1
otherwise. ``sequence_lens`` is supported: past a batch entry's length its state stops changing and
its Y rows are 0, so ``Y_h`` holds the state after its last valid step (for ``reverse``, the scan
starts at its last valid step), as in onnxruntime. Activations (names case-insensitive) and their
``activation_alpha``/``activation_beta`` consumption and defaults follow onnxruntime: alphas and
betas are consumed in order by the activations that take them; defaults LeakyRelu 0.01,
HardSigmoid 0.2/0.5, Elu 1.0, others 0. ``clip`` bounds every gate's pre-activation (peepholes
included) to ``[-clip, clip]``. f16/bf16 inputs are computed in f32 and rounded once at the outputs.

Errors: :class:`~lumc.ir.errors.ShapeError` for operand shapes or dtypes that do not fit;
:class:`~lumc.ir.errors.ModelError` for an unknown direction, layout or activation, or a wrong
number of activations.
"""
from __future__ import annotations

from typing import Callable, Sequence

from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, ShapeError
from lumc.ir.library import activations as act
from lumc.ir.tensor import Tensor, concat, split

Activation = Callable[[Tensor], Tensor]

# name -> (takes alpha, takes beta, default alpha, default beta), as onnxruntime's rnn_helpers
_ACTIVATION_ARGS = {
    "affine": (True, True, 0.0, 0.0), "relu": (False, False, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0), "thresholdedrelu": (True, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0), "scaledtanh": (True, True, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0), "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0), "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}


def _activation(name: str, a: float, b: float) -> Activation:
    fns: dict[str, Activation] = {
        "affine": lambda x: x.mul(a).add(b),
        "relu": act.relu,
        "leakyrelu": lambda x: act.leaky_relu(x, a),
        "thresholdedrelu": lambda x: act.thresholded_relu(x, a),
        "tanh": lambda x: x.tanh(),
        "scaledtanh": lambda x: x.mul(b).tanh().mul(a),
        "sigmoid": lambda x: x.sigmoid(),
        "hardsigmoid": lambda x: act.hard_sigmoid(x, a, b),
        "elu": lambda x: act.elu(x, a),
        "softsign": act.softsign,
        "softplus": act.softplus,
    }
    return fns[name]


def _activations(op: str, names: Sequence[str] | None, alphas: Sequence[float] | None,
                 betas: Sequence[float] | None, defaults: tuple[str, ...],
                 dirs: int) -> list[list[Activation]]:
    """``[direction][k]`` activation functions from the ONNX attributes."""
    k = len(defaults)
    names = list(names) if names else list(defaults) * dirs
    if len(names) == k and dirs == 2:
        names = names * 2
    if len(names) != k * dirs:
        raise ModelError(f"expects {k * dirs} activations, got {len(names)}", op=op)
    alphas, betas = list(alphas or []), list(betas or [])
    fns = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATION_ARGS:
            raise ModelError(f"unknown activation {name!r}; expected one of "
                             f"{sorted(_ACTIVATION_ARGS)}", op=op)
        takes_a, takes_b, a, b = _ACTIVATION_ARGS[key]
        if takes_a and alphas:
            a = alphas.pop(0)
        if takes_b and betas:
            b = betas.pop(0)
        fns.append(_activation(key, a, b))
    return [fns[d * k:(d + 1) * k] for d in range(dirs)]


class _Setup:
    """Validated operands of one recurrent node, in sequence-major layout and compute dtype."""

    def __init__(self, op: str, X: Tensor, W: Tensor, R: Tensor, B: Tensor | None,
                 sequence_lens: Tensor | None, inits: Sequence[Tensor | None],
                 hidden_size: int | None, direction: str, layout: int, gates: int):
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ModelError(f"unknown direction {direction!r}", op=op)
        if layout not in (0, 1):
            raise ModelError(f"layout must be 0 or 1, got {layout}", op=op)
        if X.ndim != 3 or not X.dtype.is_float:
            raise ShapeError(f"X must be a 3-D float tensor, got {X.dtype}{list(X.shape)}", op=op)
        if layout:
            X = X.transpose(0, 1)
            inits = [h.transpose(0, 1) if h is not None else None for h in inits]
        self.op, self.gates, self.direction = op, gates, direction
        self.seq, self.batch, inp = X.shape
        self.dirs = 2 if direction == "bidirectional" else 1
        hid = R.shape[-1] if R.ndim == 3 else -1
        self.hidden = hidden = hidden_size if hidden_size is not None else hid
        self.dtype = X.dtype.accumulator
        self.expect("W", W, (self.dirs, gates * hidden, inp), X.dtype)
        self.expect("R", R, (self.dirs, gates * hidden, hidden), X.dtype)
        if B is not None:
            self.expect("B", B, (self.dirs, 2 * gates * hidden), X.dtype)
        for name, h in zip(("initial_h", "initial_c"), inits):
            if h is not None:
                self.expect(name, h, (self.dirs, self.batch, hidden), X.dtype)
        self.lens = None
        if sequence_lens is not None:
            if sequence_lens.shape != (self.batch,) or sequence_lens.dtype not in (dt.i32, dt.i64):
                raise ShapeError(f"sequence_lens must be i32[{self.batch}], got "
                                 f"{sequence_lens.dtype}{list(sequence_lens.shape)}", op=op)
            self.lens = sequence_lens.reshape((self.batch, 1))
        self.X = X.cast(self.dtype)
        self.W, self.R = W.cast(self.dtype), R.cast(self.dtype)
        self.B = B.cast(self.dtype) if B is not None else None
        self.inits = [h.cast(self.dtype) if h is not None else None for h in inits]

    def expect(self, name: str, t: Tensor, shape: tuple[int, ...], dtype: dt.DType) -> None:
        if t.shape != shape or t.dtype != dtype:
            raise ShapeError(f"{name} must be {dtype}{list(shape)}, got {t.dtype}{list(t.shape)}",
                             op=self.op)

    def weight(self, t: Tensor, d: int) -> Tensor:
        """Direction ``d`` of a ``[dirs, ...]`` operand, without the leading dim."""
        return t.slice([d], [d + 1], [0]).squeeze([0])

    def biases(self, d: int) -> tuple[Tensor, Tensor]:
        """``(Wb, Rb)`` of direction ``d``, each ``[gates * hidden]`` (zeros without ``B``)."""
        n = self.gates * self.hidden
        if self.B is None:
            z = Tensor.full((n,), 0, self.dtype)
            return z, z
        wb, rb = split(self.weight(self.B, d), [n, n], 0)
        return wb, rb

    def projected(self, d: int, bias: Tensor) -> Tensor:
        """``X @ W_d^T + bias`` for every step at once: ``[seq, batch, gates * hidden]``."""
        return self.X.matmul(self.weight(self.W, d).transpose(0, 1)).add(bias)

    def initial(self, k: int, d: int) -> Tensor:
        h = self.inits[k]
        if h is None:
            return Tensor.full((self.batch, self.hidden), 0, self.dtype)
        return self.weight(h, d)

    def scan(self, d: int, step, state: tuple[Tensor, ...]):
        """Run ``step(t, state) -> (state, y)`` over the sequence for direction ``d``; masks steps
        past ``sequence_lens``. Returns ``(Y [seq, batch, hidden], final state)``."""
        reverse = self.direction == "reverse" or d == 1
        ys: list[Tensor | None] = [None] * self.seq
        for t in (reversed(range(self.seq)) if reverse else range(self.seq)):
            new, y = step(t, state)
            if self.lens is not None:
                valid = Tensor.full((self.batch, 1), t, self.lens.dtype).lt(self.lens)
                new = tuple(valid.where(n, s) for n, s in zip(new, state))
                y = valid.where(y, y.scalar_like(0.0))
            state, ys[t] = new, y
        if not ys:
            return Tensor.full((0, self.batch, self.hidden), 0, self.dtype), state
        return _stack(ys, 0), state

    def step_input(self, xw: Tensor, t: int) -> Tensor:
        return xw.slice([t], [t + 1], [0]).squeeze([0])

    def outputs(self, ys: list[Tensor], finals: list[list[Tensor]], dtype: dt.DType,
                layout: int) -> list[Tensor]:
        """``Y`` and each final state, stacked over directions, in ``layout`` and ``dtype``."""
        y = _stack(ys, 1)
        states = [_stack(list(f), 0) for f in zip(*finals)]
        if layout:
            y = y.permute((2, 0, 1, 3))
            states = [s.transpose(0, 1) for s in states]
        return [t.cast(dtype) for t in [y, *states]]


def _stack(xs: Sequence[Tensor], axis: int) -> Tensor:
    """``stack`` as a balanced tree of concats: O(n log n) selects instead of O(n^2)."""
    if len(xs) == 1:
        return xs[0].unsqueeze([axis])
    mid = len(xs) // 2
    return concat([_stack(xs[:mid], axis), _stack(xs[mid:], axis)], axis)


def _clipper(clip: float | None) -> Activation:
    if clip is None:
        return lambda x: x
    return lambda x: x.clip(-float(clip), float(clip))


def lstm(X: Tensor, W: Tensor, R: Tensor, B: Tensor | None = None,
         sequence_lens: Tensor | None = None, initial_h: Tensor | None = None,
         initial_c: Tensor | None = None, P: Tensor | None = None, *, hidden_size: int | None,
         direction: str = "forward", activations: Sequence[str] | None = None,
         activation_alpha: Sequence[float] | None = None,
         activation_beta: Sequence[float] | None = None, clip: float | None = None,
         input_forget: int = 0, layout: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """ONNX ``LSTM`` (opset 14): returns ``(Y, Y_h, Y_c)`` (shapes in the module docstring).

    Per step, with ``f, g, h`` the activations (default Sigmoid, Tanh, Tanh) and ``c()`` the clip::

        i = f(c(x Wi^T + H Ri^T + Pi * C + Wbi + Rbi))
        f = 1 - i if input_forget else f(c(x Wf^T + H Rf^T + Pf * C + Wbf + Rbf))
        C' = f * C + i * g(c(x Wc^T + H Rc^T + Wbc + Rbc))
        o = f(c(x Wo^T + H Ro^T + Po * C' + Wbo + Rbo));  H' = o * h(C')
    """
    s = _Setup("LSTM", X, W, R, B, sequence_lens, [initial_h, initial_c], hidden_size, direction,
               layout, 4)
    if P is not None:
        s.expect("P", P, (s.dirs, 3 * s.hidden), X.dtype)
        P = P.cast(s.dtype)
    fns = _activations("LSTM", activations, activation_alpha, activation_beta,
                       ("Sigmoid", "Tanh", "Tanh"), s.dirs)
    cl = _clipper(clip)
    n = s.hidden
    ys, finals = [], []
    for d in range(s.dirs):
        f_act, g_act, h_act = fns[d]
        wb, rb = s.biases(d)
        xw = s.projected(d, wb.add(rb))
        r_t = s.weight(s.R, d).transpose(0, 1)
        peep = split(s.weight(P, d), [n, n, n], 0) if P is not None else None

        def step(t, state, xw=xw, r_t=r_t, peep=peep, f_act=f_act, g_act=g_act, h_act=h_act):
            h, c = state
            gi, go, gf, gc = split(s.step_input(xw, t).add(h.matmul(r_t)), [n] * 4, 1)
            if peep is not None:
                gi, gf = gi.add(peep[0].mul(c)), gf.add(peep[2].mul(c))
            i = f_act(cl(gi))
            f = i.scalar_like(1.0).sub(i) if input_forget else f_act(cl(gf))
            c_new = f.mul(c).add(i.mul(g_act(cl(gc))))
            if peep is not None:
                go = go.add(peep[1].mul(c_new))
            h_new = f_act(cl(go)).mul(h_act(c_new))
            return (h_new, c_new), h_new

        y, final = s.scan(d, step, (s.initial(0, d), s.initial(1, d)))
        ys.append(y)
        finals.append(final)
    y, y_h, y_c = s.outputs(ys, finals, X.dtype, layout)
    return y, y_h, y_c


def gru(X: Tensor, W: Tensor, R: Tensor, B: Tensor | None = None,
        sequence_lens: Tensor | None = None, initial_h: Tensor | None = None, *,
        hidden_size: int | None, direction: str = "forward",
        activations: Sequence[str] | None = None, activation_alpha: Sequence[float] | None = None,
        activation_beta: Sequence[float] | None = None, clip: float | None = None,
        linear_before_reset: int = 0, layout: int = 0) -> tuple[Tensor, Tensor]:
    """ONNX ``GRU`` (opset 14): returns ``(Y, Y_h)`` (shapes in the module docstring).

    Per step, with ``f, g`` the activations (default Sigmoid, Tanh) and ``c()`` the clip::

        z = f(c(x Wz^T + H Rz^T + Wbz + Rbz));  r = f(c(x Wr^T + H Rr^T + Wbr + Rbr))
        h = g(c(x Wh^T + (r * H) Rh^T + Rbh + Wbh))            # linear_before_reset = 0
        h = g(c(x Wh^T + r * (H Rh^T + Rbh) + Wbh))            # linear_before_reset != 0
        H' = (1 - z) * h + z * H

    ``torch.nn.GRU`` is the ``linear_before_reset = 1`` form with gate order ``r z n``.
    """
    s = _Setup("GRU", X, W, R, B, sequence_lens, [initial_h], hidden_size, direction, layout, 3)
    fns = _activations("GRU", activations, activation_alpha, activation_beta,
                       ("Sigmoid", "Tanh"), s.dirs)
    cl = _clipper(clip)
    n = s.hidden
    ys, finals = [], []
    for d in range(s.dirs):
        f_act, g_act = fns[d]
        wb, rb = s.biases(d)
        rb_zr, rb_h = split(rb, [2 * n, n], 0)
        # Rbh sits inside the reset product when linear_before_reset; else it folds into the input
        bias = wb.add(concat([rb_zr, rb_h.scalar_like(0.0) if linear_before_reset else rb_h], 0))
        xw = s.projected(d, bias)
        r_zr, r_h = split(s.weight(s.R, d), [2 * n, n], 0)
        r_zr_t, r_h_t = r_zr.transpose(0, 1), r_h.transpose(0, 1)

        def step(t, state, xw=xw, r_zr_t=r_zr_t, r_h_t=r_h_t, rb_h=rb_h, f_act=f_act,
                 g_act=g_act):
            (h,) = state
            x_zr, x_h = split(s.step_input(xw, t), [2 * n, n], 1)
            gz, gr = split(x_zr.add(h.matmul(r_zr_t)), [n, n], 1)
            z, r = f_act(cl(gz)), f_act(cl(gr))
            if linear_before_reset:
                gh = x_h.add(r.mul(h.matmul(r_h_t).add(rb_h)))
            else:
                gh = x_h.add(r.mul(h).matmul(r_h_t))
            h_new = z.scalar_like(1.0).sub(z).mul(g_act(cl(gh))).add(z.mul(h))
            return (h_new,), h_new

        y, final = s.scan(d, step, (s.initial(0, d),))
        ys.append(y)
        finals.append(final)
    y, y_h = s.outputs(ys, finals, X.dtype, layout)
    return y, y_h


def rnn(X: Tensor, W: Tensor, R: Tensor, B: Tensor | None = None,
        sequence_lens: Tensor | None = None, initial_h: Tensor | None = None, *,
        hidden_size: int | None, direction: str = "forward",
        activations: Sequence[str] | None = None, activation_alpha: Sequence[float] | None = None,
        activation_beta: Sequence[float] | None = None, clip: float | None = None,
        layout: int = 0) -> tuple[Tensor, Tensor]:
    """ONNX ``RNN`` (opset 14): ``H' = f(c(x Wi^T + H Ri^T + Wbi + Rbi))`` with ``f`` default Tanh;
    returns ``(Y, Y_h)`` (shapes in the module docstring)."""
    s = _Setup("RNN", X, W, R, B, sequence_lens, [initial_h], hidden_size, direction, layout, 1)
    fns = _activations("RNN", activations, activation_alpha, activation_beta, ("Tanh",), s.dirs)
    cl = _clipper(clip)
    ys, finals = [], []
    for d in range(s.dirs):
        wb, rb = s.biases(d)
        xw = s.projected(d, wb.add(rb))
        r_t = s.weight(s.R, d).transpose(0, 1)

        def step(t, state, xw=xw, r_t=r_t, f_act=fns[d][0]):
            h_new = f_act(cl(s.step_input(xw, t).add(state[0].matmul(r_t))))
            return (h_new,), h_new

        y, final = s.scan(d, step, (s.initial(0, d),))
        ys.append(y)
        finals.append(final)
    y, y_h = s.outputs(ys, finals, X.dtype, layout)
    return y, y_h
