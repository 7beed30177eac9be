"""A range compile's size buckets share interpreter verdicts by kernel structure
(``measure.sharing_checks``): the same structure re-sized is checked once, a rejection holds in
every bucket, another code path (config space) is checked again, and nothing is shared outside a
range compile. Re-sized programs keep their e-class value keys. A kernel checked at several
operand precisions keeps each check's error apart (``KernelMeasurer.check_error``)."""
import numpy as np

from lumc.backends.triton.benchcases import _kernel
from lumc.compiler.core.measure import KernelMeasurer, sharing_checks
from lumc.compiler.runtime.program import KernelCall, Program, resize_program
from lumc.compiler.runtime.targets import resolve_target
from lumc.compiler.runtime.tuning_db import TuningDatabase
from lumc.ir import dtypes as dt
from lumc.ir.symbolic import Resizer, probing

VERSIONS = {"lumc": "t", "triton": "t", "driver": "t"}
P = 61


def _call(m: int, k: int, family):
    kern = _kernel("matmul", lambda a, b: a @ b, [((m, k), dt.f32), ((k, 24), dt.f32)])
    return KernelCall(kern, list(kern.inputs), list(kern.outputs), family)


def _measurer(tmp_path, name):
    return KernelMeasurer(resolve_target("sim:h200"), TuningDatabase(tmp_path / f"{name}.sqlite"),
                          VERSIONS, {})


def _counting(m, verdict):
    runs = []

    def check(e, index, cfg):
        runs.append(e.key)
        return verdict
    m._check = check
    return runs


def test_one_structure_is_checked_once_across_buckets(tmp_path):
    probe = _kernel("matmul", lambda a, b: a @ b, [((P, 300), dt.f32), ((300, 24), dt.f32)])
    with sharing_checks():
        a = _measurer(tmp_path, "a")
        runs_a = _counting(a, (True, "checked: max rel error 1e-07"))
        ka = a.add(_call(40, 300, probe))
        assert a._check_once(a.entries[ka])[0]
        b = _measurer(tmp_path, "b")
        runs_b = _counting(b, (True, "checked"))
        kb = b.add(_call(50, 300, probe))             # same structure, another size and key
        ok, note = b._check_once(b.entries[kb])
        assert ka != kb and ok and "shared" in note and runs_b == [] and len(runs_a) == 1
        assert b.shared_checks == 1
        # the same structure at a size that takes another code path (split-K): checked again
        kc = b.add(_call(4300, 300, probe))
        assert b.entries[kc].triton.rendered.config_space != b.entries[kb].triton.rendered.config_space
        b._check_once(b.entries[kc])
        assert runs_b == [kc]


def test_a_rejection_holds_in_every_bucket_and_nothing_is_shared_outside_a_range(tmp_path):
    probe = _kernel("matmul", lambda a, b: a @ b, [((P, 300), dt.f32), ((300, 24), dt.f32)])
    with sharing_checks():
        a = _measurer(tmp_path, "a")
        _counting(a, (False, "rejected: max rel error 0.5 > 1e-4"))
        assert not a._check_once(a.entries[a.add(_call(40, 300, probe))])[0]
        b = _measurer(tmp_path, "b")
        runs = _counting(b, (True, "checked"))
        ok, note = b._check_once(b.entries[b.add(_call(50, 300, probe))])
        assert not ok and note.startswith("rejected") and runs == []
    c = _measurer(tmp_path, "c")                       # no range compile: no sharing
    runs = _counting(c, (True, "checked"))
    c._check_once(c.entries[c.add(_call(50, 300, probe))])
    assert len(runs) == 1 and c.shared_checks == 0


def test_resized_programs_keep_their_value_keys_and_family():
    with probing([P]):
        kern = _kernel("matmul", lambda a, b: (a @ b).maximum(0.0),
                       [((P, 32), dt.f32), ((32, 8), dt.f32)])
    call = KernelCall(kern, list(kern.inputs), list(kern.outputs))
    prog = Program([call], {"y": kern.outputs[0]}, "t")
    prog.value_keys = {id(kern.inputs[0]): ("r", 1), id(kern.outputs[0]): ("r", 7)}
    r = Resizer({P: 5})
    rp = resize_program(prog, r)
    rc = rp.calls[0]
    assert rc.inputs[0].shape == (5, 32) and rc.family is kern
    assert rp.value_keys == {id(rc.inputs[0]): ("r", 1), id(rc.outputs[0]): ("r", 7)}
    assert resize_program(rp, Resizer({5: 5})).calls[0].family is kern
    assert np.prod(rc.outputs[0].shape) == 40


def _erring(m, errors: dict):
    """``m._check`` as the real one records a check (``checked`` and the kernel's worst), with the
    max rel error ``errors[PRECISION of the check config]``."""
    def check(e, index, cfg):
        err = errors[(cfg.kwargs() if cfg is not None else {}).get("PRECISION")]
        m.checked[(e.key, index)] = err
        e.max_error = max(e.max_error, err)
        return True, f"checked: max rel error {err:.3g}"
    m._check = check


def test_a_configs_check_error_is_its_own_precisions(tmp_path):
    """A kernel checked at fp8 and at bf16 (the fp8 policy tries both): the error of its bf16
    config, which the plan's 'numerics checks' figure and the database's bf16 verdict give, is the
    bf16 check's, not the worse fp8 one's (the report said 2.7e-2 for a plan whose bf16 kernel
    was within 1e-5; a later compile read that figure back as the bf16 verdict's)."""
    call = _call(40, 300, None)
    errors = {"fp8": 2.7e-2, "bf16": 8.6e-6}
    both = _measurer(tmp_path, "both")
    _erring(both, errors)
    key = both.add(call)
    assert both._check_once(both.entries[key], "fp8")[0]
    assert both._check_once(both.entries[key], "bf16")[0]
    assert both.entries[key].max_error == errors["fp8"]        # the worst of the kernel's checks
    assert both.check_error(key, {"PRECISION": "bf16"}) == errors["bf16"]
    assert both.check_error(key, {"PRECISION": "fp8"}) == errors["fp8"]
    again = _measurer(tmp_path, "both")          # the bf16 verdict read back from the database
    _erring(again, {})                           # (never run: the database answers)
    again.add(call)
    assert again._check_once(again.entries[key], "bf16")[0]
    assert again.entries[key].max_error == errors["bf16"]
