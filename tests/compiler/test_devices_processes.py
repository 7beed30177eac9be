"""Devices and processes: workers are forked only where CUDA cannot be broken by it; cuda:N
becomes the current device."""
import torch

from lumc.compiler.runtime import targets


def test_fork_only_before_cuda_is_touched(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert targets.fork_safe()                 # this CPU machine: the interpreter, CUDA untouched
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not targets.fork_safe()


def test_fork_refused_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")    # a GPU machine: kernels run on the GPU
    assert not targets.fork_safe()


def test_cuda_n_sets_the_current_device(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.append(str(d)))
    targets.set_current_device("cuda:1")
    targets.set_current_device("cpu")
    assert seen == ["cuda:1"]
