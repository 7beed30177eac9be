"""Attention with any elementwise score function, assembled where the e-graph left a softmax form.

The e-graph's attention rules (``rewrites.rules_kernels.attention_rules``) name the score functions
models write most: a scale, plus an additive mask, a boolean select or a fill. Others stay three
kernels: the score product, a softmax form over an elementwise function of it, the value product,
with the score matrix (``B * H * Lq * Lk`` values) written and read twice. Gemma-2 caps its logits,
``c * tanh(s / c)``, and ``tanh`` lowers to some twenty primitives (``ir.tensor_math``) that no rule
spells. The Triton attention kernel renders any elementwise ``f`` of the score tile
(``backends/triton/render_attention.py``: ``softmax(f(q @ k^T)) @ v``), so the fusion assembles
that form itself (:class:`AttentionAssembly`, a mixin of ``fusion.GreedyFusion``), in the
``+attention`` twin of each candidate whose fusion notes it could (the candidate as extracted,
three kernels, stays a candidate and competes on its bound and time like the e-graph's own unfused
alternatives; a plan that chose against the e-graph's attention forms gets no twin):

* a softmax form whose input is reached from exactly one contraction of two non-constant operands
  (the scores) through elementwise ops and views, every other leaf a side input (a mask, a bias, a
  constant);
* whose output is read only as the left operand of one contraction (the values, through views and
  casts);

becomes one ``attention`` form over ``q``, ``k``, ``v`` and the side inputs, rooted at the value
product, when :class:`~lumc.backends.triton.render_attention.AttentionPlan` accepts the kernel it
would be (checked here, so no candidate holds a kernel that cannot render). The SDPA extern applies
only where ``f`` is affine (``compiler/runtime/extern_sdpa.py`` checks it numerically), so a capped
score function runs in the Triton kernel. The simulator prices ``f`` per score element
(``simulator_attention.attention_score_seconds``).
"""
from __future__ import annotations

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE

from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.contraction import as_contraction, is_tensor_core
from lumc.compiler.core.extract import FormRecord
from lumc.compiler.core.kernel_builder import build_call

# the note a fusion without ``attention`` leaves where the twin candidate would differ
ATTENTION_REFUSAL = ("a softmax between two contractions could be one attention kernel "
                     "(+attention)")
MAX_SCORE_OPS = 96   # longest score function searched (Gemma-2's capped scores: about 30 ops)


def _chain(x: Node) -> Node:
    while x.op == "View":
        x = x.srcs[0]
    return x


def _scores(c: Node) -> bool:
    """``c`` is a contraction of two computed or input operands on tensor cores (not a projection
    by a weight: ``q @ k^T``)."""
    con = as_contraction(c)
    if con is None or not is_tensor_core(con):
        return False
    a, b = (_chain(s) for s in c.srcs[0].srcs)
    return a.op != "Constant" and b.op != "Constant"


class AttentionAssembly:
    """Softmax forms between two contractions become attention forms (module docstring)."""

    def _with_attention(self, forms: dict) -> dict:
        """``forms`` with each qualifying softmax form replaced by an attention form (with
        ``self.attention``; without it, a note names the first that would be, so the pipeline
        makes the ``+attention`` twin and the search times both)."""
        out = dict(forms)
        for rid, rec in forms.items():
            if rec.form != "softmax" or rid not in self.byid or len(rec.inputs) != 1:
                continue
            got = self._assemble(self.byid[rid], rec.inputs[0])
            if got is None:
                continue
            root, new = got
            if not self.attention:
                self._refuse(root, None, ATTENTION_REFUSAL)
                return out
            del out[rid]
            out[id(root)] = new
            self._refuse(root, None, "softmax between two contractions assembled into an "
                                     "attention kernel (its score function is not one the "
                                     "attention rules spell)")
        return out

    def _assemble(self, sm: Node, x: Node) -> tuple[Node, FormRecord] | None:
        found = self._score_region(x)
        if found is None:
            return None
        c1, sides = found
        c2 = self._value_product(sm)
        if c2 is None or c2 is c1:
            return None
        q, kt = (_chain(s) for s in c1.srcs[0].srcs)
        mul2 = c2.srcs[0]
        v = _chain(mul2.srcs[1])
        # the kernel writes only the values: a score, a step of f or the softmax read elsewhere
        # (a model output, a second softmax over the same scores) would leave the form dropped by
        # ``_form_groups`` (the softmax form with it) or, for an output, a one-product "attention"
        # kernel that cannot render. A step of the mask alone (no score in it) read elsewhere too
        # (a dead-row flag's reduction reads the same condition) is read as an input instead.
        for _ in range(8):
            inputs = list(dict.fromkeys([q, kt, v] + sides))
            masked = any(s.numel > 1 for s in sides)
            rec = FormRecord("attention", (("mask", "function"), ("masked", masked)), inputs)
            members = self._members(id(c2), rec)
            inside = members | {id(c2)}
            leak = next((m for m in members if m in self.outputs or any(
                id(u) not in inside for u, _ in self.uses.get(m, []))), None)
            if leak is None:
                break
            n = self.byid[leak]
            if leak in self.outputs or self._depends_on(n, c1):
                self._refuse(sm, c2, f"softmax not assembled into attention: %{n.id}:{n.op} "
                                     "inside it is read elsewhere")
                return None
            sides = sides + [n]
        else:
            return None
        stop = {id(n) for n in inputs}
        try:
            from lumc.backends.triton.render_attention import AttentionPlan
            AttentionPlan(build_call([c2], lambda n: id(n) in stop, "attention", rec.attrs,
                                     push_views=False).kernel)
        except (RenderError, ValueError, KeyError, IndexError) as e:
            self._refuse(sm, c2, f"softmax not assembled into attention: {e}"[:200])
            return None
        return c2, rec

    def _score_region(self, x: Node) -> tuple[Node, list[Node]] | None:
        """``(scores contraction, side inputs)`` when ``x`` is an elementwise function of exactly
        one score contraction (:func:`_scores`) and of leaves that do not depend on it."""
        contractions: list[Node] = []
        sides: list[Node] = []
        seen: set[int] = set()
        stack, ops = [x], 0
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if n.op == "View":
                stack.append(n.srcs[0])
            elif n.op == "SumReduce" and _scores(n):
                contractions.append(n)
            elif n.op in ELEMENTWISE and id(n) not in self.group:
                ops += 1
                if ops > MAX_SCORE_OPS:
                    return None
                stack.extend(n.srcs)
            elif n.op not in ("Constant", "Iota"):
                sides.append(n)
        if len(contractions) != 1 or any(self._depends_on(s, contractions[0]) for s in sides):
            return None
        return contractions[0], sides

    def _depends_on(self, n: Node, c: Node, limit: int = 4096) -> bool:
        seen, stack = set(), [n]
        while stack and len(seen) < limit:
            m = stack.pop()
            if m is c:
                return True
            if id(m) not in seen:
                seen.add(id(m))
                stack.extend(m.srcs)
        return bool(stack)         # too deep to tell: assume it does

    def _value_product(self, sm: Node) -> Node | None:
        """The one contraction whose left operand reads softmax output ``sm`` (through views and
        casts), when that is its only reader."""
        frontier, found = [sm], []
        while frontier:
            n = frontier.pop()
            uses = self.uses.get(id(n), [])
            if not uses or id(n) in self.outputs:
                return None
            for u, _ in uses:
                if u.op == "Cast":
                    frontier.append(u)
                    continue
                if u.op != "Mul" or _chain(u.srcs[0]) is not n:
                    return None
                sums = [s for s, _ in self.uses.get(id(u), [])]
                if len(sums) != 1 or sums[0].op != "SumReduce" or as_contraction(sums[0]) is None:
                    return None
                found.append(sums[0])
        return found[0] if len(found) == 1 else None

    def _attention_row_values(self, root: Node, members: set[int]) -> set[int]:
        """Row-sized elementwise ops outside an attention form that read only its inside (its
        softmax's row max) and constants: ``max(scores) < lowest finite``, PyTorch's
        ``_safe_softmax`` test for a row whose every score is -inf. The kernel holds the max after its loop, so it
        computes them too (instead of the form being dropped for a max read elsewhere); one read
        by another kernel is written as a row output (:meth:`_write_attention_row_values`)."""
        found: set[int] = set()
        frontier = [u for m in members for u, _ in self.uses.get(m, [])]
        seen: set[int] = set()
        while frontier and len(seen) < MAX_SCORE_OPS:
            frontier.sort(key=lambda n: self.pos[id(n)])
            x = frontier.pop(0)
            if id(x) in seen or id(x) in members or x is root:
                continue
            seen.add(id(x))
            srcs = [_chain(s) for s in x.srcs]
            inside = [s for s in srcs if id(s) in members or id(s) in found]
            if x.op not in ELEMENTWISE or id(x) in self.outputs or not inside or any(
                    s.numel != x.numel for s in inside) or not all(
                    id(s) in members or id(s) in found or s.op in ("Constant", "Iota")
                    for s in srcs) or any(s.op == "SumReduce" for s in inside):
                continue
            found.add(id(x))
            frontier.extend(u for u, _ in self.uses.get(id(x), []))
        return found

    def _write_attention_row_values(self, exits: dict) -> None:
        """A row value an attention kernel computes (:meth:`_attention_row_values`) that another
        kernel reads is written by it, as a second output of ``B x H x Lq`` values."""
        for rid, rows in self.row_claims.items():
            exit_ = exits.get(rid)
            for k in sorted(rows, key=lambda k: self.pos[k]):
                if k in self.realized and exit_ is not None and k != id(exit_):
                    self.row_outputs.setdefault(id(exit_), []).append(self.byid[k])
                    self.row_owned.add(k)
