"""Timing one kernel config on a CUDA GPU: the kernel, not the Python call path.

A Python launch of a generated kernel costs ~100 us of host time on a slow CPU, while the kernels
lumc times run 3-10 us, so events recorded around a Python call measure Python. Here:

1. the launcher is pre-bound (``TritonKernel.bound_launch``: input checks and conversions done once);
2. ``LAUNCHES_PER_GRAPH`` launches, each on the next of several rotating copies of the inputs, are
   captured in one CUDA graph (``torch.cuda.CUDAGraph``); a sample replays the graph between two
   CUDA events and divides by the number of launches, so the host cost of one ``replay()`` is
   spread over N kernels and the GPU runs them back to back;
3. before each sample a 256 MiB buffer is overwritten (flushing the 50 MB L2 of Hopper; the
   ~60 us of GPU work also lets the host enqueue the events and the replay before the GPU reaches
   them, so nothing between the events waits on the host);
4. the result is the median of ``repeats`` samples (Triton's ``do_bench`` and Inductor's benchmarker
   take the same median of event timings).

Rotating copies are as many as overflow L2 twice (at most one per launch, within 512 MiB), so
consecutive launches read inputs that are not left in L2 by the previous one; a kernel whose inputs
are so small that all copies fit in L2 is timed with warm inputs, as it runs inside a model.

Where capture fails (a kernel that synchronizes, an old driver), each sample is one pre-bound
launch between the events, after the flush. The GPU-facing calls go through :class:`TorchCuda`, so
the arithmetic is tested on a CPU with a fake device (``tests/compiler/test_gpu_timing.py``).
"""
from __future__ import annotations

import math

L2_FLUSH_BYTES = 256 << 20       # > 5x the 50 MB L2 of H100/H200 (Hopper tuning guide)
L2_BYTES = 50 << 20
ROTATE_BUDGET = 512 << 20        # device memory the rotating input copies may take
LAUNCHES_PER_GRAPH = 20


def rotating_copies(in_bytes: int, launches: int) -> int:
    """How many copies of the inputs to rotate over (see module docstring)."""
    in_bytes = max(int(in_bytes), 1)
    want = math.ceil(2 * L2_BYTES / in_bytes)
    return max(1, min(launches, want, ROTATE_BUDGET // in_bytes))


class TorchCuda:
    """The CUDA calls of the timing loop, on ``device`` (``cuda:N``)."""

    def __init__(self, device: str):
        import torch
        self.torch = torch
        self.device = torch.device(device)

    def scope(self):
        """A context making ``device`` the current device (allocation, launch, events)."""
        return self.torch.cuda.device(self.device)

    def to_device(self, x):
        from lumc.backends.triton.launch import to_torch
        return to_torch(x, str(self.device))

    def flush_buffer(self):
        return self.torch.empty(L2_FLUSH_BYTES, dtype=self.torch.int8, device=self.device)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def capture(self, fns: list):
        """A CUDA graph replaying ``fns`` in order, or None when capture fails."""
        torch = self.torch
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):          # warm-up on a side stream, as torch requires
                for f in fns[:2]:
                    f()
            torch.cuda.current_stream(self.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for f in fns:
                    f()
            self.synchronize()
            return g
        except Exception:
            self.synchronize()
            return None


def _bind(launch, ins: list, outs: list, cfg):
    if hasattr(launch, "bound_launch"):
        if cfg is None and hasattr(launch, "run_config"):
            cfg = launch.run_config()
        return launch.bound_launch(ins, outs, cfg)
    return lambda: launch(*ins, outputs=outs, config=cfg)


def cuda_event_samples(launch, cfg, ins: list, device: str, repeats: int = 25, warmup: int = 5,
                       launches: int = LAUNCHES_PER_GRAPH, cuda=None) -> list[float]:
    """Seconds per launch of ``launch(*inputs, outputs=, config=cfg)``, one sample per repeat (see
    module docstring).

    Args:
        launch: a ``TritonKernel`` or ``ExternKernel`` (or any callable with that convention).
        cfg: the config passed to every launch.
        ins: input arrays or tensors, in placeholder order.
        device: ``cuda`` or ``cuda:N`` (made the current device for the whole measurement).
        repeats, warmup: samples taken, untimed launches before them.
        launches: kernel launches per CUDA-graph replay.
        cuda: the CUDA calls (default :class:`TorchCuda`; tests pass a fake).
    Returns:
        ``repeats`` floats, seconds per launch.
    """
    cuda = cuda or TorchCuda(device)
    with cuda.scope():
        ins = [cuda.to_device(v) for v in ins]
        in_bytes = sum(t.numel() * t.element_size() for t in ins)
        copies = rotating_copies(in_bytes, launches)
        sets = [ins] + [[t.clone() for t in ins] for _ in range(copies - 1)]
        outs = launch(*ins, config=cfg)
        bound = [_bind(launch, s, outs, cfg) for s in sets]
        for i in range(max(warmup, 1)):
            bound[i % copies]()
        cuda.synchronize()
        graph = cuda.capture([bound[j % copies] for j in range(launches)])
        per = launches if graph is not None else 1
        flush = cuda.flush_buffer()
        times = []
        for i in range(repeats):
            flush.zero_()
            start, end = cuda.event(), cuda.event()
            start.record()
            if graph is not None:
                graph.replay()
            else:
                bound[i % copies]()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / per)
    return times
