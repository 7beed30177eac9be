"""lumc.compile's ``shapes=`` and ``bind=`` of an ONNX model are dicts: anything else was used as
one and ended in a traceback ("AttributeError: 'str' object has no attribute 'values'" for
``shapes="n=3"``); it is one InputError now, before any work."""
from __future__ import annotations

import numpy as np
import pytest

import lumc
from lumc.compiler.runtime.tuning_db import TuningDatabase

pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.mark.parametrize("kw", [{"shapes": "n=3"}, {"shapes": [("n", 3)]}, {"shapes": 3},
                                {"bind": "k=1"}, {"bind": 5}, {"bind": [("k", 1)]}])
def test_shapes_and_bind_that_are_not_dicts_are_one_input_error(tiny_path, kw, monkeypatch):
    monkeypatch.setattr("lumc.compiler.core.pipeline.TuningDatabase",
                        lambda *a, **k: pytest.fail("work started for a malformed argument"))
    name = next(iter(kw))
    with pytest.raises(lumc.InputError, match=f"^{name}= is a dict .* got "):
        lumc.compile(str(tiny_path), budget="10s", device="sim:h200", **kw)


def test_the_same_shapes_as_a_dict_compile(tiny_path, tiny_weights, tmp_path):
    w, b = tiny_weights
    f = lumc.compile(str(tiny_path), budget="30s", device="sim:h200", shapes={"n": 3},
                     db=TuningDatabase(tmp_path / "db.sqlite"))
    x = np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3)
    k = np.arange(6, dtype=np.int64).reshape(3, 2)
    y, k2 = f(x, k)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w + b, rtol=1e-6)
    np.testing.assert_array_equal(k2, 2 * k)
