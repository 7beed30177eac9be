"""The GPU runtime's buffer plan (``runtime/gpu_plan.GpuPlan``) run here on the CPU, its kernels in
the Triton interpreter: torch tensors in, fresh torch tensors out, no numpy round trip (on a GPU a
call through the Python API copied every input to the host and back, and every output twice).
Values against the CPU executor, outputs that are views of buffers and of inputs included, and a
second call with other inputs (the buffers are reused: an output must not alias them)."""
import numpy as np
import pytest
import torch

import lumc
from lumc.backends.triton.launch import interpreter_mode


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 24)

    def forward(self, x, ids):
        h = torch.nn.functional.gelu(self.fc(self.ln(x)))
        # the last: a prefix of a value nothing else reads, copied out by its own kernel and
        # served from that kernel's buffer (not from the value it views, which no kernel writes)
        return h.transpose(0, 1), h.sum(-1), x.reshape(-1), self.ln.weight[ids], (x * 3.0)[0:2]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``(module, its lumc.compile, example args)``, compiled once for this file."""
    mp = pytest.MonkeyPatch()      # this file's cache, undone after it
    mp.setenv("LUMC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    torch.manual_seed(0)
    m = Block().eval()
    args = (torch.randn(5, 16), torch.tensor([3, 0, 15]))
    yield m, lumc.compile(m, example_inputs=args, budget="20s", device="sim:h200"), args
    mp.undo()


@pytest.mark.skipif(not interpreter_mode(), reason="CPU Triton interpreter only")
def test_gpu_plan_runs_on_tensors_without_host_round_trip(compiled):
    from lumc.compiler.runtime.gpu_plan import GpuPlan
    _, f, args = compiled
    f(*args)
    cm = f.specializations[0].compiled
    plan = GpuPlan(cm)
    names = list(cm.graph.inputs)
    calls = []
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        x, ids = torch.randn(5, 16, generator=g), torch.randint(0, 16, (3,), generator=g)
        out = plan.run_tensors(dict(zip(names, (x, ids))))
        assert all(isinstance(v, torch.Tensor) for v in out.values())
        want = cm.run(dict(zip(names, (x.numpy(), ids.numpy()))))
        for k, v in want.items():
            np.testing.assert_allclose(out[k].numpy(), v, rtol=2e-5, atol=2e-6)
        calls.append(out)
    # the first call's outputs are its own tensors, not the plan's buffers the second overwrote
    g = torch.Generator().manual_seed(1)
    x, ids = torch.randn(5, 16, generator=g), torch.randint(0, 16, (3,), generator=g)
    first = cm.run(dict(zip(names, (x.numpy(), ids.numpy()))))
    for k, v in first.items():
        np.testing.assert_allclose(calls[0][k].numpy(), v, rtol=2e-5, atol=2e-6)


def test_compiled_model_call_keeps_tensors_as_tensors(compiled):
    """``CompiledModel.__call__`` on torch tensors returns tensors equal to eager's, as the
    module's call does."""
    m, f, args = compiled
    got = f(*args)
    cm = f.specializations[0].compiled
    direct = cm(*args)
    want = m(*args)
    for a, b, c in zip(got, direct, want):
        assert isinstance(b, torch.Tensor)
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5)
