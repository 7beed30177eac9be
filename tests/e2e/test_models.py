"""The four MODELS.md models through lumc (import + reference executor) against onnxruntime.

Inputs follow each model's recipe (real-looking token ids and masks, byte values, audio, an image);
models with dynamic dims run at two shapes. Float outputs must agree to max rel error 1e-4 in fp32
(rel = max|a-b| / max|b|, as in ``lumc run --check``); integer outputs exactly.
"""
from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from lumc.compiler.frontends import models
from lumc.compiler.tools.cli import compare_output

RTOL = 1e-4
CASES = [pytest.param(name, i, id=f"{name}-{'-'.join('x'.join(map(str, s)) for s in shp.values())}")
         for name, info in models.MODEL_INFO.items() for i, shp in enumerate(info.test_shapes)]


@pytest.mark.models
@pytest.mark.parametrize("name,case", CASES)
def test_model_matches_onnxruntime(name, case, model_path, record_time):
    from lumc.backends.reference import ReferenceExecutor
    from lumc.compiler.frontends import onnx_frontend as fe

    info = models.MODEL_INFO[name]
    path = model_path(name)
    model = fe.load_model(path)
    fe.check_supported(model)
    specs = fe.model_input_specs(model)
    shapes = info.test_shapes[case]
    assert {s.name for s in specs} == set(shapes)
    inputs = models.random_inputs(shapes, {s.name: s.dtype.np for s in specs}, seed=case, info=info)

    t0 = time.perf_counter()
    imported = fe.import_onnx(model, shapes)
    t1 = time.perf_counter()
    got = ReferenceExecutor(imported.graph)(inputs)
    t2 = time.perf_counter()
    record_time(f"import {t1 - t0:.3f} s, run", t2 - t1)

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, inputs)))
    assert list(got) == names
    for out_name in names:
        c = compare_output(np.asarray(got[out_name]), ref[out_name], RTOL)
        assert c.ok, f"{name} output {out_name}: max_abs {c.max_abs:.3g} max_rel {c.max_rel:.3g} {c.note}"


def test_minilm_recipe_looks_like_tokenized_text():
    shapes = {"input_ids": (3, 21), "attention_mask": (3, 21)}
    d = {"input_ids": np.int64, "attention_mask": np.int64}
    x = models.random_inputs(shapes, d, seed=0, info=models.MODEL_INFO["minilm-l3"])
    ids, mask = x["input_ids"], x["attention_mask"]
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape == (3, 21)
    assert (ids[:, 0] == 101).all() and (ids < models.MINILM_VOCAB).all() and (ids >= 0).all()
    for row_ids, row_mask in zip(ids, mask):
        n = int(row_mask.sum())
        assert (row_mask[:n] == 1).all() and (row_mask[n:] == 0).all()  # trailing padding only
        assert row_ids[n - 1] == 102 and (row_ids[n:] == 0).all()
    assert mask[-1].sum() < 21  # some row is padded


def test_magika_recipe_is_bytes():
    x = models.random_inputs({"bytes": (2, 2048)}, {"bytes": np.int32}, 0, models.MODEL_INFO["magika"])
    b = x["bytes"]
    assert b.dtype == np.int32 and b.min() >= 0 and b.max() <= 255 and len(np.unique(b)) > 200


def test_silero_recipe_is_audio():
    shapes = {"input": (3, 576), "h": (1, 1, 128), "c": (1, 1, 128)}
    x = models.random_inputs(shapes, dict.fromkeys(shapes, np.float32), 0, models.MODEL_INFO["silero-vad"])
    assert {k: v.shape for k, v in x.items()} == shapes
    assert np.abs(x["input"]).max() <= 1 and x["input"].std() > 0.01


@pytest.mark.models
def test_minilm_vocab_matches_embedding(model_path):
    m = onnx.load(model_path("minilm-l3"), load_external_data=False)
    emb = next(t for t in m.graph.initializer if t.name.endswith("word_embeddings.weight"))
    assert emb.dims[0] == models.MINILM_VOCAB


@pytest.mark.models
def test_fetch_verifies_and_refetches_bad_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMC_CACHE_DIR", str(tmp_path))
    info = models.MODEL_INFO["silero-vad"]  # the smallest wheel (1 MB)
    path = models.fetch_model("silero-vad")
    assert path.parent == tmp_path / "models" and models.file_sha256(path) == info.sha256
    assert models.identify_model(path) is info
    path.write_bytes(b"corrupt")
    assert models.cached_model_path("silero-vad") is None
    assert models.fetch_model("silero-vad") == path and models.file_sha256(path) == info.sha256
    assert [p.name for p in (tmp_path / "models").iterdir()] == [path.name]  # no temp leftovers


def test_ppocr_recipe_is_a_document_image():
    x = models.random_inputs({"x": (1, 3, 64, 96)}, {"x": np.float32}, 0, models.MODEL_INFO["ppocr-det"])["x"]
    assert x.shape == (1, 3, 64, 96) and x.dtype == np.float32 and np.abs(x).max() <= 1
    dark = (x < -0.4).mean()  # glyph strokes: a minority of pixels, on light paper
    assert 0.02 < dark < 0.3 and np.median(x) > 0.6
