"""Fuzz: a seeded corpus of hostile inputs, run in parallel; no traceback, no hang, bounded memory.

The corpus (:func:`corpus`, 247 cases, seed :data:`SEED`) mutates the real models of MODELS.md
(structure and bytes), random small graphs (run and compile), a real artifact (bytes, zip bombs,
nesting, wrong types, lying headers, missing parts) and tuning databases (bad rows, damage).
Each case runs one lumc command in-process (click's runner) in its own forked child of this warm
process, two at a time: the child's peak RSS comes from ``wait4``, a child still running after
:data:`CASE_TIMEOUT_S` is killed and counted as a hang. A clean result is exit 0, 1 or 2 with no
traceback anywhere in its output, and exit 2 is exactly one ``lumc: error:`` line.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import fuzz_cases as fc  # noqa: E402
from conftest import tiny_model  # noqa: E402

SEED = 15
CASE_TIMEOUT_S = 60.0
WORKERS = 2
MAX_GROWTH_BYTES = 1_500_000_000   # a case may grow its process by at most this over the parent
MODEL_COUNTS = {"silero-vad": 64, "magika": 64, "ppocr-det": 16, "minilm-l3": 12}


def corpus(rng: random.Random) -> list[tuple[str, str, int]]:
    """``(kind, source, seed)`` for every case, in a seeded order."""
    cases = [("model", name, rng.randrange(2 ** 31)) for name, n in MODEL_COUNTS.items()
             for _ in range(n)]
    cases += [("graph-run", "small", rng.randrange(2 ** 31)) for _ in range(24)]
    cases += [("graph-compile", "small", rng.randrange(2 ** 31)) for _ in range(3)]
    cases += [("artifact", rng.choice(["run", "inspect"]), rng.randrange(2 ** 31))
              for _ in range(60)]
    cases += [("db", "compile", rng.randrange(2 ** 31)) for _ in range(2)]
    cases += [("db-rows", "compile", rng.randrange(2 ** 31)) for _ in range(2)]
    rng.shuffle(cases)
    return cases


def _shape_args(name: str) -> list[str]:
    from lumc.compiler.frontends.models import MODEL_INFO
    shapes = MODEL_INFO[name].test_shapes[0]
    return [a for k, v in shapes.items() for a in ("--shape", f"{k}={'x'.join(map(str, v))}")]


def _case_args(case, work: Path, env: dict) -> list[str]:
    """Build the case's hostile input under ``work``; the lumc command line that reads it."""
    kind, source, seed = case
    rng = random.Random(seed)
    if kind == "model":
        bad = work / "model.onnx"
        bad.write_bytes(fc.mutate_model(Path(env["models"][source]).read_bytes(), rng))
        return ["run", bad, "--random", *_shape_args(source)]
    if kind in ("graph-run", "graph-compile"):
        m = fc.small_graph(rng)
        p = work / "g.onnx"
        p.write_bytes(m.SerializeToString() if rng.random() < 0.7 else
                      fc.mutate_model(m.SerializeToString(), rng))
        if kind == "graph-run":
            return ["run", p, "--random", "--backend", rng.choice(["reference", "triton"])]
        return ["compile", p, "--budget", "4s", "-o", work / "g.lumc", "--quiet"]
    if kind == "artifact":
        import lumc
        bad = work / "a.lumc"
        fc.mutate_artifact(env["artifact"], bad, rng, lumc.__version__)
        return ["run", bad, "--random"] if source == "run" else ["inspect", bad]
    if kind == "db":
        fc.poison_db(work / "cache" / "tuning.sqlite", rng)
        return ["compile", env["tiny"], "--budget", "4s", "--shape", "n=2", "-o", work / "t.lumc",
                "--quiet"]
    # db-rows: a real database whose every row is then poisoned, and a compile that reads them
    import shutil
    shutil.copytree(env["cache"], work / "cache", dirs_exist_ok=True)
    shutil.rmtree(work / "cache" / "plans", ignore_errors=True)
    fc.poison_matching_rows(work / "cache" / "tuning.sqlite", rng)
    return ["compile", env["tiny"], "--budget", "4s", "--shape", "n=3", "-o", work / "t.lumc",
            "--quiet"]


def _child(case, env: dict, out_fd: int) -> None:
    """In the forked child: run the case, write ``{exit, stderr, exc}`` as JSON to ``out_fd``."""
    from click.testing import CliRunner

    from lumc.compiler.tools.cli import cli
    work = Path(tempfile.mkdtemp(prefix="fuzz-", dir=env["root"]))
    os.environ["LUMC_CACHE_DIR"] = str(work / "cache")
    log = os.open(work / "fd.log", os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)           # anything printed past click (a worker, an at-exit hook) lands here
    os.dup2(log, 2)
    res = {"exit": None, "stderr": "", "exc": None}
    try:
        args = [str(a) for a in _case_args(case, work, env)]
        r = CliRunner().invoke(cli, args)
        res["exit"] = r.exit_code
        res["stderr"] = r.stderr[-2000:]
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            res["exc"] = f"{type(r.exception).__name__}: {str(r.exception)[:300]}"
        res["args"] = args[:1]
    except BaseException as e:   # the harness itself (building the input) must not hide a bug
        res["exc"] = f"harness {type(e).__name__}: {str(e)[:300]}"
    os.close(log)
    res["fd_log"] = (work / "fd.log").read_text(errors="replace")[-2000:]
    os.write(out_fd, json.dumps(res).encode()[:60000])


def run_corpus(cases, env: dict, workers: int = WORKERS) -> list[dict]:
    """Run every case in a forked child, ``workers`` at a time; one result dict per case."""
    pending = list(enumerate(cases))
    running: dict[int, tuple] = {}
    results: list[dict] = [None] * len(cases)
    while pending or running:
        while pending and len(running) < workers:
            i, case = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:   # pragma: no cover (the child)
                os.close(r)
                try:
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    _child(case, env, w)
                finally:
                    os._exit(0)
            os.close(w)
            running[pid] = (i, case, r, time.monotonic())
        time.sleep(0.02)
        for pid, (i, case, r, t0) in list(running.items()):
            done, status, ru = os.wait4(pid, os.WNOHANG)
            hang = False
            if done == 0:
                if time.monotonic() - t0 < CASE_TIMEOUT_S:
                    continue
                os.kill(pid, signal.SIGKILL)
                _, status, ru = os.wait4(pid, 0)
                hang = True
            data = b""
            while chunk := os.read(r, 65536):
                data += chunk
            os.close(r)
            res = json.loads(data) if data else {"exit": None, "stderr": "", "exc": None}
            res.update(case=list(case), hang=hang, seconds=time.monotonic() - t0,
                       maxrss=ru.ru_maxrss * 1024, cpu=ru.ru_utime + ru.ru_stime, signal=os.WTERMSIG(status)
                       if os.WIFSIGNALED(status) else None)
            results[i] = res
            del running[pid]
    return results


def _rss_now() -> int:
    """This process's resident set now, in bytes (a forked child starts from it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def classify(res: dict, baseline: int) -> str:
    """``clean``, ``traceback``, ``hang`` or ``oom`` (see the module docstring)."""
    if res["hang"]:
        return "hang"
    if res["maxrss"] - baseline > MAX_GROWTH_BYTES or res["signal"] == signal.SIGKILL:
        return "oom"
    text = res["stderr"] + res.get("fd_log", "")
    if res["exc"] or "Traceback" in text or res["exit"] not in (0, 1, 2) or res["signal"]:
        return "traceback"
    if res["exit"] == 2:
        lines = res["stderr"].strip().splitlines()
        errors = [ln for ln in lines if not ln.startswith("lumc: warning:")]
        if len(errors) != 1 or not errors[0].startswith("lumc: error: "):
            return "traceback"
    return "clean"


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory, model_path):
    """Real models, a compiled tiny artifact and its tuning database; this process warmed up."""
    import subprocess
    root = tmp_path_factory.mktemp("fuzz")
    tiny = root / "tiny.onnx"
    tiny.write_bytes(tiny_model().SerializeToString())
    cache = root / "cache"
    # compiled in a subprocess: egglog's thread pool must not exist in the process that forks
    # the cases (a forked child would wait forever on threads it does not have)
    subprocess.run([sys.executable, "-m", "lumc.compiler.tools.cli", "compile", str(tiny), "--budget",
                    "30s", "--device", "sim:h200", "--shape", "n=3", "-o", str(root / "tiny.lumc"),
                    "--quiet"], check=True, env=dict(os.environ, LUMC_CACHE_DIR=str(cache)),
                   capture_output=True, timeout=300)
    return {"root": str(root), "tiny": str(tiny), "artifact": str(root / "tiny.lumc"),
            "cache": str(cache), "models": {n: str(model_path(n)) for n in MODEL_COUNTS}}


def _run_in_clean_parent(env: dict) -> tuple[list, list[dict], int, float]:
    """The corpus run by a fresh Python that forks the cases: a process that has run other tests
    holds thread pools (egglog, torch, a check pool's manager thread) whose locks a forked child
    inherits held and waits on forever. Returns ``(cases, results, parent RSS, wall seconds)``."""
    import subprocess
    out = Path(env["root"]) / "fuzz-results.json"
    cfg = Path(env["root"]) / "fuzz-env.json"
    cfg.write_text(json.dumps(env))
    timeout = CASE_TIMEOUT_S * 260 / WORKERS
    subprocess.run([sys.executable, __file__, str(cfg), str(out)], check=True, timeout=timeout)
    data = json.loads(out.read_text())
    return [tuple(c) for c in data["cases"]], data["results"], data["baseline"], data["wall"]


def _main(cfg: str, out: str) -> None:
    env = json.loads(Path(cfg).read_text())
    # warm, as a test process is: every case forks from imported lumc, torch and Triton, so a
    # case's growth is its own work (no thread pool is started by these imports)
    import torch  # noqa: F401
    import lumc  # noqa: F401
    import lumc.backends.triton  # noqa: F401
    from lumc.compiler.core import pipeline  # noqa: F401
    from lumc.compiler.tools import cli  # noqa: F401
    cases = corpus(random.Random(SEED))
    baseline = _rss_now()
    t0 = time.monotonic()
    results = run_corpus(cases, env)
    Path(out).write_text(json.dumps({"cases": cases, "results": results, "baseline": baseline,
                                     "wall": time.monotonic() - t0}))


def test_fuzz_corpus_has_no_traceback_hang_or_memory_blowup(fuzz_env, record_time):
    cases, results, baseline, wall = _run_in_clean_parent(fuzz_env)
    assert len(cases) >= 200
    kinds = [classify(r, baseline) for r in results]
    counts = {k: kinds.count(k) for k in ("clean", "traceback", "hang", "oom")}
    art = [r["maxrss"] - baseline for r in results if r["case"][0] == "artifact"]
    worst = max(results, key=lambda r: r["maxrss"] if r["case"][0] == "artifact" else 0)
    record_time(f"fuzz: {len(cases)} cases {counts}; worst artifact case {worst['case']} peak "
                f"{worst['maxrss'] / 1e6:.0f} MB (+{max(art) / 1e6:.0f} MB over the parent's "
                f"{baseline / 1e6:.0f} MB); worst case of all peak "
                f"{max(r['maxrss'] for r in results) / 1e6:.0f} MB; cases' CPU "
                f"{sum(r['cpu'] for r in results):.0f} s; wall", wall)
    bad = [(k, r["case"], f"peak {r['maxrss'] / 1e6:.0f} MB over {baseline / 1e6:.0f} MB",
            r["exc"] or r["stderr"][-400:] or r.get("fd_log", "")[-400:])
           for k, r in zip(kinds, results) if k != "clean"]
    assert not bad, bad[:5]
    # the corpus really is hostile: most cases are refused with one line
    assert sum(r["exit"] == 2 for r in results) > len(results) // 2


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
