"""Loading a plan: a repeated layer's kernels share one meaning, read once."""
import numpy as np
import torch

import lumc
import lumc.compiler.runtime.compiled as compiled


def test_a_repeated_layers_kernel_meaning_is_read_once(tmp_path, monkeypatch):
    """BERT-base's stored plan read 62 kernel meanings, 12 of each of its layer's kernels, one by
    one (2.1 s of a 5.9 s recompile); each distinct meaning is read once now, and every call of
    the loaded plan computes what the compiled one does."""
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
                              for _ in range(4)]).eval()
    x = torch.randn(8, 32)
    f = lumc.compile(m, example_inputs=(x,), budget="15s", device="sim:h200")
    f.save(tmp_path / "m.lumc")
    reads = []
    real = compiled.graph_from_bytes

    def counting(*a, **k):
        reads.append(1)
        return real(*a, **k)
    monkeypatch.setattr(compiled, "graph_from_bytes", counting)
    g = lumc.load(tmp_path / "m.lumc")
    calls = g.specializations[0].compiled.program.calls if hasattr(g, "specializations") else \
        g.program.calls
    distinct = {(c.kernel.form, repr(c.kernel.meaning)) for c in calls}
    assert len(calls) >= 2 and len(reads) == 1 + len(distinct) < 1 + len(calls), (reads, calls)
    with torch.no_grad():
        want = m(x)
    np.testing.assert_allclose(np.asarray(g(x)), want.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(f(x)))
