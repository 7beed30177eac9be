"""Scan forms in greedy fusion (``lumc.compiler.core.fusion``): a cumsum's triangular contraction
named a ``scan`` form by the e-graph (``lumc.rewrites.spellings``,
``lumc.backends.scan_structure``).

* Its operand's elementwise prologue is computed on load, once per element (a contraction would
  recompute it per output column, so fusion realizes a long one there).
* Its ``L x L`` mask reads no tensor: the scan kernel never forms it, and the scans of one row
  share it (it is not claimed by any one form).
* Scans of the same rows (same axis, length, direction and result shape: the library's float
  cumsum scans its finite part and the counts of ``+inf`` and ``-inf`` seen) whose epilogues meet
  are one kernel, one carried sum each, the combination its epilogue.
"""
from __future__ import annotations

from lumc.ir.graph import Node
from lumc.backends.scan_structure import scan_of


class ScanFusion:
    """Mixin of :class:`~lumc.compiler.core.fusion.GreedyFusion` (uses its ``forms``, ``group``,
    ``byid``, ``pos`` and ``_refuse``)."""

    def _scan_partners(self, n: Node) -> list[Node]:
        """Later scan forms over the same rows as scan form ``n`` (same axis, length, direction
        and result shape: the library's float cumsum scans its finite part and its infinities'
        counts), which one kernel computes with ``n`` when an epilogue closes over all of them."""
        if self.forms[id(n)].form != "scan" or (spec := scan_of(n)) is None:
            return []
        key = (spec.k, spec.n, spec.exclusive, spec.reverse, n.shape)
        out = []
        for rid, rec in self.forms.items():
            m = self.byid.get(rid)
            if rid == id(n) or rec.form != "scan" or m is None or self.pos[rid] < self.pos[id(n)]:
                continue
            s = scan_of(m)
            if s is not None and (s.k, s.n, s.exclusive, s.reverse, m.shape) == key:
                out.append(m)
        return out

    def _merge_scans(self, n: Node, partners: list[Node]) -> None:
        """Scan forms ``partners`` become part of ``n``'s kernel (one program per row, one carried
        sum each); logged once per partner."""
        for p in partners:
            for k, g in list(self.group.items()):
                if g == id(p):
                    self.group[k] = id(n)
            del self.forms[id(p)]
            self._refuse(p, n, "a scan of the same rows: one kernel, one carried sum per scan")

    def _scan_operand(self, u: Node) -> bool:
        """Whether ``u`` is the product of a scan form: a scan computes its operand's prologue on
        load, once per element (not once per output column, as a contraction would)."""
        rec = self.forms.get(self.group.get(id(u)))
        return rec is not None and rec.form == "scan"

    def _data_free(self, n: Node) -> bool:
        """Whether ``n`` reads no tensor (only iotas and scalar constants: an index mask)."""
        memo = self._data_free_memo
        stack = [(n, False)]      # iterative: a model's graph is deeper than Python's stack
        while stack:
            x, ready = stack.pop()
            if id(x) in memo:
                continue
            if not x.srcs:
                memo[id(x)] = x.op == "Iota" or (x.op == "Constant" and x.numel == 1)
            elif ready:
                memo[id(x)] = all(memo[id(s)] for s in x.srcs)
            else:
                stack.append((x, True))
                stack.extend((s, False) for s in x.srcs if id(s) not in memo)
        return memo[id(n)]
