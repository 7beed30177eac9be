"""lumc.compile of a torch module shows no warning of torch's own internals: torch.export's
decomposition deep-copies pytree specs, which trips torch's deprecation of
``isinstance(treespec, LeafSpec)`` (a FutureWarning pointing at copyreg.py that the user cannot act
on), and under ``-W error::FutureWarning`` it made the compile fail as 'torch.export failed'."""
import warnings

import torch

import lumc


def test_compiling_a_module_warns_nothing_and_survives_warnings_as_errors():
    m = torch.nn.Linear(8, 4).eval()
    x = torch.randn(2, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lumc.compile(m, budget="20s", example_inputs=(x,))
    assert not [w for w in seen if "LeafSpec" in str(w.message)], [str(w.message) for w in seen]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        g = lumc.compile(m, budget="20s", example_inputs=(x,))
    torch.testing.assert_close(g(x), m(x).detach(), rtol=1e-4, atol=1e-5)
