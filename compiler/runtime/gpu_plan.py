"""Executing a compiled program on a CUDA GPU: a buffer plan that reuses memory, and CUDA graphs.

The plan walks the kernel calls once and gives every intermediate tensor a buffer from a free list
keyed by byte size, returning it after the tensor's last reader (lifetimes from the call order), so
peak memory is the largest set of simultaneously live intermediates, not their sum. For static shapes
(always, in lumc's specialized graphs) the whole launch sequence is captured once in a CUDA graph and
replayed, removing per-kernel launch overhead from the host. A plan re-sized from a range bucket
(``lumc.compiler.runtime.variants``) launches the bucket's size-generic kernels, so one Triton compile
per kernel serves the bucket; its CUDA graph is captured per exact size (one ``GpuPlan`` per
re-sized plan, at most ``VariantModel.MAX_INSTANCES`` of them). Not yet run on a GPU.

This path runs only where a CUDA GPU is present (``make gpu-check``); without one, a compiled model
executes on the CPU executor.
"""
from __future__ import annotations

import numpy as np

from lumc.ir.graph import Node
from lumc.ir.ops import apply_view
from lumc.compiler.runtime.program import output_source


class GpuPlan:
    """Buffers and launches for one compiled model on its CUDA device."""

    def __init__(self, cm):
        import torch
        from lumc.backends.triton.launch import to_torch
        from lumc.compiler.runtime.extern import config_from_dict, launcher_for
        self.cm = cm
        self.device = cm.torch_device
        self.kernels = []
        sized = getattr(cm, "sized", None)     # a range bucket's plan re-sized to this call's size
        for i, (c, cfg) in enumerate(zip(cm.program.calls, cm.configs)):
            # a Triton kernel, or an extern (vendor) implementation through torch
            tk = launcher_for(c.kernel, cfg)
            if sized is not None and (cfg or {}).get("IMPL", "triton") == "triton":
                # the bucket's size-generic module: one Triton compile serves every size of it
                template, probes, sizes, table, largest = sized
                tk = _SizedLaunch(template.calls[i].kernel, probes, sizes, table, largest)
            self.kernels.append((c, tk, config_from_dict(cfg)))
        # lifetimes: last call index reading each node
        last: dict[int, int] = {}
        for i, c in enumerate(cm.program.calls):
            for n in c.inputs:
                last[id(n)] = i
        self.written = {id(n) for c in cm.program.calls for n in c.outputs}
        outs = {id(self._base(n)) for n in cm.program.outputs.values()}
        self.weights = {id(n): to_torch(n.arg.value, self.device)
                        for c in cm.program.calls for n in c.inputs if n.op == "Constant"}
        self.inputs = {id(n): torch.empty(n.shape, dtype=_tdt(n), device=self.device)
                       for n in cm.graph.inputs.values()}
        free: dict[int, list] = {}
        self.buffers: dict[int, object] = {}
        for i, c in enumerate(cm.program.calls):
            for n in c.outputs:
                nbytes = n.nbytes
                pool = free.get(nbytes)
                raw = pool.pop() if pool else torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                self.buffers[id(n)] = raw.view(_tdt(n)).view(n.shape) if nbytes else \
                    torch.empty(n.shape, dtype=_tdt(n), device=self.device)
                self.buffers[id(n), "raw"] = raw
            for n in c.inputs:
                if last.get(id(n)) == i and id(n) in self.buffers and id(n) not in outs:
                    raw = self.buffers[id(n), "raw"]
                    free.setdefault(raw.numel(), []).append(raw)
        self.graph = None

    def _base(self, n: Node) -> Node:
        return output_source(n, self.written)

    def _tensor(self, n: Node):
        if id(n) in self.inputs:
            return self.inputs[id(n)]
        if id(n) in self.weights:
            return self.weights[id(n)]
        return self.buffers[id(n)]

    def _launch_all(self):
        for c, tk, conf in self.kernels:
            tk(*[self._tensor(n) for n in c.inputs], outputs=[self._tensor(n) for n in c.outputs],
               config=conf)

    def run_numpy(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`run_tensors` on numpy arrays (copied to the device and back, synchronized)."""
        from lumc.backends.triton.launch import to_numpy, to_torch
        out = self.run_tensors({name: to_torch(arrays[name], self.device)
                                for name in self.cm.graph.inputs})
        return {k: np.asarray(to_numpy(v), order="C") for k, v in out.items()}

    def run_tensors(self, tensors: dict) -> dict:
        """Run on ``{input name: torch tensor}`` (the plan's dtypes and shapes, checked by the
        caller; on any device: copied into the plan's input buffers, device to device on the
        GPU); returns ``{output name: torch tensor}`` on the plan's device, fresh tensors (the
        buffers are reused by the next call). Launches are queued on the current stream with no
        host synchronization and no host copy, as a torch module's call is."""
        import torch
        from lumc.compiler.runtime import graph_torch as gt
        from lumc.backends.triton.launch import to_torch
        cuda = str(self.device).startswith("cuda")
        for name, n in self.cm.graph.inputs.items():
            self.inputs[id(n)].copy_(tensors[name])
        if self.graph is None:
            self._launch_all()                      # warm-up: compiles every kernel
            self.graph = False
            if cuda:
                torch.cuda.synchronize(self.device)
                try:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        self._launch_all()
                    self.graph = g
                except Exception:                   # capture unsupported: plain launches
                    self.graph = False
        elif self.graph:
            self.graph.replay()
        else:
            self._launch_all()
        out = {}
        for name, n in self.cm.program.outputs.items():
            base = self._base(n)
            if base.op == "Constant":
                v = self.weights.get(id(base))
                v = v if v is not None else to_torch(base.arg.value, self.device)
            elif base.op == "Input":
                v = tensors[base.arg.name].to(self.device)
            else:
                v = self.buffers[id(base)]
            if base is not n:
                v = gt.view_op(v, tuple(n.arg.shape), tuple(n.arg.strides),
                               int(n.arg.offset), n.arg.mask)
            out[name] = v.clone(memory_format=torch.contiguous_format)
        return out


_SIZED: dict[tuple, object] = {}     # (template kernel, probes) -> SizedKernel, one per bucket kernel


class _SizedLaunch:
    """A size-generic kernel (``lumc.backends.triton.size_generic``) bound to one call's sizes,
    with the launcher convention of ``TritonKernel`` (inputs, ``outputs=``, ``config=``)."""

    def __init__(self, kernel, probes: dict, sizes: dict, table: dict | None = None,
                 largest: dict | None = None):
        from lumc.backends.triton.size_generic import SizedKernel
        key = (id(kernel), tuple(sorted(probes.items())))
        if key not in _SIZED:     # (the entry keeps the kernel alive)
            _SIZED[key] = (kernel, SizedKernel(kernel, probes, table, largest))
        self.sk = _SIZED[key][1]
        self.sizes = dict(sizes)

    def __call__(self, *inputs, outputs=None, config=None):
        return self.sk(*inputs, sizes=self.sizes, outputs=outputs, config=config)


def _tdt(n: Node):
    from lumc.backends.triton.launch import torch_dtype
    return torch_dtype(n.dtype)
