"""Register spills read from Triton's compiled-kernel caches around one launch (fake caches)."""
from types import SimpleNamespace

from lumc.backends.triton.resources import spills_of_launch


class FakeJit:
    def __init__(self):
        self.device_caches = {0: ({}, "target", "backend", "binder")}

    def compile(self, key, spills):
        self.device_caches[0][0][key] = SimpleNamespace(n_spills=spills, n_regs=255)


def test_spills_of_the_kernels_a_launch_compiled():
    f = FakeJit()
    f.compile("old", 4096)                        # compiled before: not this launch's
    mod = SimpleNamespace(k=f)
    n, out = spills_of_launch(mod, ("k",), lambda: (f.compile("new", 0), "outs")[1])
    assert (n, out) == (0, "outs")
    n, _ = spills_of_launch(mod, ("k",), lambda: f.compile("new2", 128))
    assert n == 128
    n, _ = spills_of_launch(mod, ("k",), lambda: None)     # nothing new compiled: unknown
    assert n is None
