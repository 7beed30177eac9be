"""``torch.compile(model, backend="lumc", dynamic=True)``: a Dynamo graph with symbolic sizes
compiles once for a size range (``lumc.compiler.core.buckets``) and serves every size in it without
another lumc compile; outputs against PyTorch eager at fp32. Sizes outside the range compile that
shape alone; a graph whose sizes do not re-size falls back to one compile per shape."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lumc.compiler.core import torch_backend as tb
from lumc.compiler.core.buckets import DimRange

# torch.export / Dynamo deep-copy pytree specs through a deprecated path (PyTorch's own warning)
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """An empty tuning database and plan cache, Dynamo's caches and counters reset."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    from torch._dynamo.utils import counters as dynamo_counters
    torch._dynamo.reset()
    dynamo_counters.clear()
    tb.counters.clear()
    yield
    torch._dynamo.reset()


def frames() -> int:
    """Frames Dynamo compiled (a recompile for a new size is one more)."""
    from torch._dynamo.utils import counters as dynamo_counters
    return dynamo_counters["frames"]["total"]


def err(y: torch.Tensor, ref: torch.Tensor) -> float:
    assert y.shape == ref.shape and y.dtype == ref.dtype, (y.shape, ref.shape)
    return (y - ref).abs().max().item()


def keep_graphs(seen: list, **options):
    """A backend that is ``lumc`` with ``options``, keeping the DynamoGraphs it makes."""
    def backend(gm, example_inputs):
        g = tb.lumc_backend(gm, example_inputs, **options)
        seen.append(g)
        return g
    return backend


class LinearSoftmax(nn.Module):
    """``x [B, L, 16], bias [B, L] -> softmax over L of (x W + b + bias)``: L is on two inputs."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 8)

    def forward(self, x, bias):
        return torch.softmax(self.lin(x) + bias[..., None], dim=1)


def test_small_module_compiles_once_for_its_range(monkeypatch):
    torch.manual_seed(0)
    m = LinearSoftmax().eval()
    seen = []
    f = torch.compile(m, backend=keep_graphs(seen, budget="20s", device="sim:h200", max_size=128),
                      dynamic=True)
    with torch.no_grad():
        for n in (5, 17, 64, 100):
            x, bias = torch.randn(1, n, 16), torch.randn(1, n)
            assert err(f(x, bias), m(x, bias)) <= 1e-5, n
    assert frames() == 1 and len(seen) == 1
    g = seen[0]
    assert g.compiles == 1 and tb.counters["compiles"] == 1 and tb.counters["range_compiles"] == 1
    assert g.per_shape_reason is None and not g.specializations and g.outside_calls == 0
    (dim,) = g.dims.values()              # L, the same SymInt on x and bias: one dim
    assert len(dim.uses) == 2 and dim.range == DimRange(2, 128)   # Dynamo specializes 0 and 1
    assert len(g.ranged.report_dict()["variants"]) == 4
    assert "kernel search once for the size range" in g.report()

    # a call in the range runs its torch tensors through the re-sized plan's run_tensors (on a
    # GPU: no host copy and no synchronization), never through the numpy run
    from lumc.compiler.runtime.compiled import CompiledModel
    fed = []
    real = CompiledModel.run_tensors

    def run_tensors(self, tensors, checked=False):
        fed.append([isinstance(v, torch.Tensor) for v in tensors.values()])
        return real(self, tensors, checked)

    def numpy_run(self, inputs):
        raise AssertionError("a range call went through numpy")
    monkeypatch.setattr(CompiledModel, "run_tensors", run_tensors)
    monkeypatch.setattr(CompiledModel, "run", numpy_run)
    with torch.no_grad():
        for n in (7, 40):
            x, bias = torch.randn(1, n, 16), torch.randn(1, n)
            assert err(f(x, bias), m(x, bias)) <= 1e-5, n
    assert g.compiles == 1 and len(fed) == 2 and all(all(t) for t in fed)


def test_gpt2_dynamic_compiles_once_and_matches_eager():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=256)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    # positions index a 128-row table: the range stops there
    f = torch.compile(m, backend="lumc", dynamic=True,
                      options={"budget": "40s", "device": "sim:h200", "max_size": 128})
    errors = {}
    with torch.no_grad():
        for n in (5, 17, 64, 100):
            ids = torch.randint(0, 256, (1, n))
            y, ref = f(ids), m(ids)
            errors[n] = err(y.logits, ref.logits)
            assert errors[n] <= 1e-4, (n, errors[n])
    assert tb.counters["compiles"] == 1 and tb.counters["range_compiles"] == 1, tb.counters
    assert tb.counters["graphs"] == 1 and frames() == 1
    assert not tb.counters["outside_range"] and not tb.counters["per_shape_fallbacks"]


def test_mark_dynamic_range_options_and_sizes_outside_it():
    """Dynamo's range (mark_dynamic min/max) is read from its ShapeEnv; ``shapes`` narrows it; a
    size inside Dynamo's range but outside lumc's compiles that shape alone, once."""
    torch.manual_seed(2)
    m = LinearSoftmax().eval()
    seen = []
    f = torch.compile(m, backend=keep_graphs(seen, budget="20s", device="sim:h200",
                                             shapes={"x.1": (4, 24)}))
    x, bias = torch.randn(1, 6, 16), torch.randn(1, 6)
    torch._dynamo.mark_dynamic(x, 1, min=4, max=40)
    torch._dynamo.mark_dynamic(bias, 1, min=4, max=40)
    with torch.no_grad():
        assert err(f(x, bias), m(x, bias)) <= 1e-5
        for n in (4, 24, 30, 30, 11):
            x, bias = torch.randn(1, n, 16), torch.randn(1, n)
            assert err(f(x, bias), m(x, bias)) <= 1e-5, n
    g = seen[0]
    (dim,) = g.dims.values()
    assert (dim.lo, dim.hi) == (4, 40) and dim.range == DimRange(4, 24)
    assert g.compiles == 2 and g.outside_calls == 2 and len(g.specializations) == 1
    assert tb.counters["range_compiles"] == 1 and tb.counters["shape_compiles"] == 1
    assert frames() == 1
    with pytest.raises(Exception, match="not a dynamic dim"):
        torch._dynamo.reset()
        torch.compile(m, backend="lumc", dynamic=True,
                      options={"shapes": {"y.3": (2, 8)}, "device": "sim:h200"})(x, bias)


def test_two_dynamic_dims():
    torch.manual_seed(3)
    m = LinearSoftmax().eval()
    seen = []
    f = torch.compile(m, backend=keep_graphs(seen, budget="20s", device="sim:h200", max_size=16),
                      dynamic=True)
    with torch.no_grad():
        for b, n in ((3, 5), (7, 12), (16, 2), (2, 16)):
            x, bias = torch.randn(b, n, 16), torch.randn(b, n)
            assert err(f(x, bias), m(x, bias)) <= 1e-5, (b, n)
    g = seen[0]
    assert len(g.dims) == 2 and g.compiles == 1 and frames() == 1
    assert len(g.ranged.report_dict()["variants"]) == 4      # 2 x 2 buckets


class Padded(nn.Module):
    """Pads the dynamic dim by one row each side: its sizes are L + 2 (an affine value)."""

    def forward(self, x):
        return torch.softmax(F.pad(x, (0, 0, 1, 1)), dim=1) * 2.0


class Gram(nn.Module):
    """x x^T flattened, one more element: L**2 + 1, neither a product of L nor of L + a."""

    def forward(self, x):
        return torch.cat([(x @ x.transpose(1, 2)).reshape(-1), torch.ones(1)])


def test_a_padded_graph_is_one_ranged_compile():
    torch.manual_seed(4)
    m = Padded().eval()
    seen = []
    f = torch.compile(m, backend=keep_graphs(seen, budget="20s", device="sim:h200"), dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 5, 30):
            x = torch.randn(1, n, 8)
            assert err(f(x), m(x)) <= 1e-6, n
    g = seen[0]
    assert g.ranged is not None and g.compiles == 1 and frames() == 1


def test_graph_that_does_not_resize_falls_back_per_shape():
    torch.manual_seed(4)
    m = Gram().eval()
    seen = []
    f = torch.compile(m, backend=keep_graphs(seen, budget="8s", device="sim:h200"), dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 5):
            x = torch.randn(1, n, 8)
            assert err(f(x), m(x)) <= 1e-5, n
    g = seen[0]
    assert g.ranged is None and "not products of" in g.per_shape_reason
    assert g.compiles == 2 and len(g.specializations) == 2 and frames() == 1
    assert tb.counters["per_shape_fallbacks"] == 1 and "compiled per shape" in g.report()


class OuterScores(nn.Module):
    """``x [S] -> softmax(x x^T) x``: an [S, S] value."""

    def forward(self, x):
        return torch.softmax(x[:, None] * x[None, :], dim=-1) @ x


def test_range_too_large_for_memory_falls_back_per_shape():
    # a range whose top sizes' check holds a [B, S, S] value past the machine's memory (T5's
    # position-biased scores at B = S = 1023 were 16 GiB) raised MemoryError out of torch.compile,
    # or met the OOM killer
    torch.manual_seed(5)
    m = OuterScores().eval()
    seen = []
    # (a budget with room: at 10 s a loaded machine ran past its grace, a BudgetError)
    f = torch.compile(m, backend=keep_graphs(seen, budget="40s", device="sim:h200",
                                             max_size=1 << 20), dynamic=True)
    with torch.no_grad():
        for n in (5, 9):
            x = torch.randn(n)
            assert err(f(x), m(x)) <= 1e-5, n
    g = seen[0]
    assert g.ranged is None and "GiB memory" in g.per_shape_reason, g.per_shape_reason
    assert g.compiles == 2 and frames() == 1


def test_a_float_argument_of_another_sign_is_not_the_baked_one():
    """Dynamo passes a Python float as a 0-d tensor that lumc bakes into the trace; a call with
    -0.0 after 0.0 compared equal to it (``-0.0 == 0.0``) and reused the 0.0 plan:
    ``1 / (x * s)`` gave +inf where eager gives -inf."""
    def fn(x, s: float):
        return 1 / (x * s)
    f = torch.compile(fn, backend="lumc", dynamic=True, options={"budget": "10s",
                                                                 "device": "sim:h200"})
    x = torch.tensor([1.0, 2.0])
    with torch.no_grad():
        for s in (0.5, 0.0, -0.0, 0.0, 1.5):
            assert torch.equal(f(x, s), fn(x, s)), s


def test_a_per_shape_fallback_warns_naming_why():
    """The range compile's failure was silent: each new shape ran a kernel search of its own (a
    Llama graph dynamic in batch and sequence, 1..1024 each, took seconds per new shape) with
    nothing said but in a report out of the user's reach."""
    torch.manual_seed(4)
    m = Gram().eval()
    f = torch.compile(m, backend="lumc", dynamic=True,
                      options={"budget": "8s", "device": "sim:h200"})
    with torch.no_grad(), pytest.warns(UserWarning, match="not compiled for a size range .*not "
                                       "products of.*each new shape is compiled on its own"):
        x = torch.randn(1, 5, 8)
        assert err(f(x), m(x)) <= 1e-5
