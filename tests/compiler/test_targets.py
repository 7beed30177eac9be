"""Compile targets: device names, errors, and measured ceilings cached once per device."""
import dataclasses

import pytest

from lumc.compiler.runtime import targets
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir.errors import LumcError


def test_resolve_simulated_and_errors():
    t = targets.resolve_target("sim:h100")
    assert t.simulated and t.name == "sim:h100-sxm" and t.torch_device == "cpu"
    assert targets.resolve_target("SIM:H200").spec.hbm_bandwidth == 4.8e12
    with pytest.raises(LumcError, match="unknown device"):
        targets.resolve_target("tpu")
    with pytest.raises(LumcError, match="unknown simulated device"):
        targets.resolve_target("sim:a100")
    if not targets._cuda_available():
        with pytest.raises(LumcError, match="no CUDA GPU"):
            targets.resolve_target("cuda:0")
        assert targets.resolve_target(None).name == "sim:h200"


def test_measured_ceilings_are_cached(tmp_path, monkeypatch):
    calls = []

    def fake_measure(dev):
        calls.append(dev)
        return {"bandwidth": 4.1e12, "bf16": 7.0e14, "f16": 7.0e14}

    monkeypatch.setattr(targets, "measure_ceilings", fake_measure)
    monkeypatch.setattr(targets, "_cuda_available", lambda: False)
    gpu = dataclasses.replace(targets.resolve_target("sim:h200"), simulated=False,
                              name="cuda:0 FAKE H200", torch_device="cuda:0")
    db = TuningDatabase(tmp_path / "t.sqlite")
    a = targets.with_measured_ceilings(gpu, db)
    b = targets.with_measured_ceilings(gpu, db)
    assert len(calls) == 1                              # measured once, then from the database
    assert a.spec.hbm_bandwidth == b.spec.hbm_bandwidth == 4.1e12
    assert a.spec.tensor_flops["bf16"] == 7.0e14 and a.spec.tensor_flops["f32"] == gpu.spec.tensor_flops["f32"]
    sim = targets.resolve_target("sim:h200")
    assert targets.with_measured_ceilings(sim, db) is sim
