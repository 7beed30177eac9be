"""GPU timing: the arithmetic and structure of the CUDA-graph loop, on a fake device (CPU), and on a
real GPU (``gpu`` marker) that a trivial kernel times in microseconds, not Python's ~100 us."""
import contextlib

import numpy as np
import pytest

from lumc.compiler.runtime import gpu_timing as gt

KERNEL_S = 3e-6      # what one launch of the fake kernel costs on the fake GPU
HOST_S = 100e-6      # what one Python call costs on the host (never on the GPU clock)


class FakeGpu:
    """A GPU clock: kernels advance it, host calls do not; events read it."""

    def __init__(self):
        self.clock = 0.0
        self.launched_sets = []
        self.capturing = None

    def launch(self, which):
        if self.capturing is not None:
            self.capturing.append(which)
        else:
            self.clock += KERNEL_S
            self.launched_sets.append(which)


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.t = gpu, None

    def record(self):
        self.t = self.gpu.clock

    def synchronize(self):
        pass

    def elapsed_time(self, other):          # milliseconds, as torch's
        return (other.t - self.t) * 1e3


class FakeGraph:
    def __init__(self, gpu, launches):
        self.gpu, self.launches = gpu, launches

    def replay(self):
        for w in self.launches:
            self.gpu.launch(w)


class FakeCuda:
    def __init__(self, capture_ok=True):
        self.gpu = FakeGpu()
        self.capture_ok = capture_ok

    def scope(self):
        return contextlib.nullcontext()

    def to_device(self, x):
        import torch
        return torch.from_numpy(np.asarray(x))

    def flush_buffer(self):
        gpu = self.gpu

        class Flush:
            def zero_(self):
                gpu.clock += 50e-6          # GPU work before the start event: not timed
        return Flush()

    def synchronize(self):
        pass

    def event(self):
        return FakeEvent(self.gpu)

    def capture(self, fns):
        if not self.capture_ok:
            return None
        self.gpu.capturing = []
        for f in fns:
            f()
        g = FakeGraph(self.gpu, self.gpu.capturing)
        self.gpu.capturing = None
        return g


class FakeKernel:
    """A pre-bindable launcher: each bound launch costs host time (ignored) and one fake kernel."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.bound = 0

    def __call__(self, *ins, outputs=None, config=None):
        return [ins[0].clone()]

    def bound_launch(self, ins, outs, config):
        self.bound += 1
        tag = id(ins[0])
        return lambda: self.cuda.gpu.launch(tag)


@pytest.mark.parametrize("capture_ok", [True, False])
def test_samples_measure_the_kernel_not_the_host(capture_ok):
    cuda = FakeCuda(capture_ok)
    k = FakeKernel(cuda)
    x = np.zeros((1 << 20,), np.float32)           # 4 MiB: copies rotate
    times = gt.cuda_event_samples(k, None, [x], "cuda:0", repeats=7, warmup=3, launches=20,
                                  cuda=cuda)
    assert len(times) == 7
    assert all(t == pytest.approx(KERNEL_S) for t in times)
    copies = gt.rotating_copies(x.nbytes, 20)
    assert copies == 20 and k.bound == copies      # one pre-bound launcher per rotating copy
    if capture_ok:                                  # each replay walks every copy in turn
        replayed = cuda.gpu.launched_sets[-20:]
        assert len(set(replayed)) == copies


def test_rotating_copies_overflow_l2_within_memory():
    assert gt.rotating_copies(1 << 20, 20) == 20               # capped by launches per graph
    assert gt.rotating_copies(64 << 20, 20) == 2               # 2 x 64 MiB > 2 x 50 MB L2
    assert gt.rotating_copies(1 << 30, 20) == 1                # a single copy past the budget
    assert gt.rotating_copies(0, 20) == 20


@pytest.mark.gpu
def test_trivial_kernel_times_under_10_us():
    import torch
    from lumc.backends.triton.benchcases import _kernel
    from lumc.backends.triton.launch import TritonKernel
    from lumc.ir import dtypes as dt
    k = _kernel("pointwise", lambda x: x + x, [((1024,), dt.f32)])
    tk = TritonKernel(k)
    x = torch.randn(1024, device="cuda")
    t = float(np.median(gt.cuda_event_samples(tk, tk.default_config(), [x], "cuda:0")))
    assert 0 < t < 10e-6
