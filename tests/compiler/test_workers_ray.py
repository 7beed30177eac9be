"""``--workers ray`` on a local Ray cluster of 2 CPUs (one cluster for the module: Ray starts in
about 5 s).

* ``lumc compile`` of Magika and MiniLM on ``sim:h200`` with ``--workers ray`` (joining the
  cluster through ``RAY_ADDRESS``) makes the same choice and the same report figures as
  ``--workers local:1``, each from an empty tuning database.
* An actor killed while it runs a unit costs that unit only: it is retried on another actor and
  the compile returns a checked artifact, the loss in its report.
* The pool alone: a unit lost twice fails with ``WorkerLost`` and the pool goes on; a hung unit's
  actor is killed; a unit's own exception is its result; an array goes to the object store once.
* The tests' clusters keep their files in a private ``RAY_TMPDIR``: the ``ray_current_cluster``
  record of a cluster the user runs on the machine stays as it was.
"""
from __future__ import annotations

import contextlib
import json
import logging
import operator
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import ray

from lumc.compiler.core.ray_workers import RayWorkers, WorkerLost
from lumc.compiler.core.workers import parse_workers
from lumc.compiler.runtime.targets import resolve_target

MODELS = {
    "magika": ["--shape", "bytes=1x2048"],
    "minilm-l3": ["--shape", "batch_size=1", "--shape", "sequence_length=8"],
}


DRIVER_ENV = "LUMC_TEST_RAY_DRIVER"    # set in the child process that is a Ray driver
driver_only = pytest.mark.skipif(DRIVER_ENV not in os.environ,
                                 reason="a Ray driver's test: test_in_a_driver_process runs it")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_head(num_cpus: int = 2):
    """``ray start --head --block`` of ``num_cpus`` CPUs in a child process (its reaper stops
    every Ray process of it when that child ends); yields the cluster's GCS address once it takes
    a driver, and stops it on exit.

    Ray's files go to a private, short ``RAY_TMPDIR`` (Ray's socket paths must fit 107 bytes), set
    in this process and its children until the exit and then removed: ``ray start`` records its
    address in ``$RAY_TMPDIR/ray/ray_current_cluster`` (default ``/tmp/ray``), the record a bare
    ``ray.init`` on this machine joins, which belongs to a cluster the user may run here.

    Raises:
        pytest.fail.Exception: ``ray start`` exited, or no driver joined in 30 tries.
    """
    import shutil
    import tempfile
    port = _free_port()
    address = f"{ray.util.get_node_ip_address()}:{port}"     # where ray start puts its GCS
    private = tempfile.mkdtemp(prefix="lr", dir="/tmp")
    # no token authentication: ``ray start`` turns it on when ~/.ray/auth_token exists (which a
    # local ``ray.init`` writes), while a driver joining by address does not send the token
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_TMPDIR", private)
    mp.setenv("RAY_AUTH_MODE", "disabled")
    mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
                             "--block", f"--num-cpus={num_cpus}", "--include-dashboard=false",
                             f"--port={port}",
                             "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 f"assert ray.cluster_resources().get('CPU') == {num_cpus}; ray.shutdown()")
        for _ in range(30):                   # until the cluster takes a driver with its CPUs
            if head.poll() is not None:
                pytest.fail(f"ray start exited with {head.returncode}")
            try:
                r = subprocess.run([sys.executable, "-c", probe, address], capture_output=True,
                                   timeout=60, env=env)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0:
                break
            time.sleep(1.0)
        else:
            pytest.fail(f"no Ray cluster at {address}")
        yield address
    finally:
        head.terminate()                      # its reaper stops the cluster's processes
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=30)
        mp.undo()
        shutil.rmtree(private, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster():
    """The address of a local Ray cluster with 2 CPUs (:func:`ray_head`), stopped after the module.

    The cluster is ``ray start`` in a child process, never ``ray.init`` in this one: a Ray
    driver's threads can deadlock the interpreter's exit after every test has passed
    (ray-project/ray#29431 and #44836; it once held a CI run until its time limit). The tests that
    need a driver of their own run it in a child pytest (:func:`test_in_a_driver_process`); there
    this fixture joins the cluster."""
    if DRIVER_ENV in os.environ:
        ray.init(address=os.environ[DRIVER_ENV], log_to_driver=False, logging_level=logging.ERROR)
        try:
            yield os.environ[DRIVER_ENV]
        finally:
            ray.shutdown()
        return
    with ray_head(2) as address:
        yield address


def test_the_test_cluster_leaves_the_users_ray_record(monkeypatch):
    """The tests' cluster keeps off the Ray record of a cluster the user runs on this machine
    (``$RAY_TMPDIR/ray/ray_current_cluster``, here a record planted in a directory standing for
    ``/tmp``): ``ray start`` used to overwrite it with the tests' address, which was dead after
    the tests (a bare ``ray.init`` of the user then joined nothing)."""
    import shutil
    import tempfile
    user = tempfile.mkdtemp(prefix="lu", dir="/tmp")
    record = os.path.join(user, "ray", "ray_current_cluster")
    os.makedirs(os.path.dirname(record))
    with open(record, "w") as f:
        f.write("10.9.8.7:6379")
    monkeypatch.setenv("RAY_TMPDIR", user)
    try:
        with ray_head(1):
            assert open(record).read() == "10.9.8.7:6379"
            assert os.environ["RAY_TMPDIR"] != user
        assert open(record).read() == "10.9.8.7:6379"
        assert os.listdir(os.path.dirname(record)) == ["ray_current_cluster"]  # no session dir
        assert os.environ["RAY_TMPDIR"] == user
    finally:
        shutil.rmtree(user)


@pytest.mark.skipif(DRIVER_ENV in os.environ, reason="the parent's test")
@pytest.mark.parametrize("name", ["test_killed_worker_costs_one_unit", "test_pool_faults_and_data",
                                  "test_pool_hung_unit_and_close"])
def test_in_a_driver_process(name, ray_cluster):
    """Run one driver test in a child pytest joined to the module's cluster; the child ends with
    ``os._exit`` once its session is over (tests/compiler/ray_driver_exit.py)."""
    env = {**os.environ, DRIVER_ENV: ray_cluster,
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(__file__),
                                                        os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "ray_driver_exit", f"{__file__}::{name}"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]


def lumc_compile(model, args, workers, tmp_path, address) -> dict:
    tag = "".join(c for c in workers if c.isalnum())
    rep = tmp_path / f"{tag}.json"
    env = {**os.environ, "LUMC_CACHE_DIR": str(tmp_path / f"cache-{tag}")}
    if address:
        env["RAY_ADDRESS"] = address
    r = subprocess.run([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()",
                        "compile", str(model), "--budget", "120s", "--device", "sim:h200", *args,
                        "-o", str(tmp_path / "out.lumc"), "--report", str(rep), "--quiet",
                        "--workers", workers], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr       # Ray's own logging stays quiet
    return json.loads(rep.read_text())


@pytest.mark.models
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "minilm-l3" else n
                                  for n in MODELS])     # MiniLM's two compiles: 84 s on 2 cores
def test_ray_makes_the_choice_local_makes(name, ray_cluster, model_path, tmp_path):
    local = lumc_compile(model_path(name), MODELS[name], "local:1", tmp_path, ray_cluster)
    dist = lumc_compile(model_path(name), MODELS[name], "ray", tmp_path, ray_cluster)
    assert "budget" not in local["stopped_because"]      # a search that ran to its end
    for k in ("candidate_label", "kernels", "best_time_s", "bound_time_s", "max_rel_error",
              "candidates_total", "candidates_pruned", "candidates_timed", "candidates_rejected",
              "measurements", "stopped_because", "form_counts"):
        assert dist[k] == local[k], k
    assert [(p["kernel"], p["impl"], p["config"]) for p in dist["per_kernel"]] == \
        [(p["kernel"], p["impl"], p["config"]) for p in local["per_kernel"]]
    assert local["max_rel_error"] < 1e-4
    lw, dw = local["workers"], dist["workers"]
    assert lw["kind"] == "local" and lw["count"] == 1 and lw["units"] == lw["units_per_worker"][0]
    assert dw["kind"] == "ray" and dw["count"] == 2 and len(dw["units_per_worker"]) == 2
    assert dw["started_cluster"] is False and dw["address"] == ray_cluster    # joined, not started
    assert dw["units"] == lw["units"] > 0       # the same units, spread over two workers
    assert dw["units_lost"] == dw["retried"] == 0


def small_model():
    """softmax(x @ W + b) over f32[16, 32] @ [32, 24]: a few kernels, quick to check."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
         helper.make_node("Softmax", ["z"], ["y"], axis=-1)], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 24])],
        [numpy_helper.from_array(rng.standard_normal((32, 24)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@driver_only
def test_killed_worker_costs_one_unit(ray_cluster, tmp_path, monkeypatch):
    """``ray.kill`` of the actor running the compile's first unit: the unit runs again on the
    other actor, the compile returns a checked artifact, and the report counts the loss."""
    import onnxruntime as ort

    import lumc
    from lumc.compiler.core import ray_workers
    from lumc.compiler.core.pipeline import compile_model
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    from lumc.compiler.tools.cli import compare_output
    killed: list[int] = []
    assign = ray_workers.RayWorkers._assign

    def assign_then_kill(self):
        assign(self)
        busy = [s for s in self._slots if s.ref is not None]
        if busy and not killed:
            killed.append(busy[0].index)
            ray.kill(busy[0].actor)
    monkeypatch.setattr(ray_workers.RayWorkers, "_assign", assign_then_kill)
    model = small_model()
    cm = compile_model(model, budget="60s", device="sim:h200",
                       db=TuningDatabase(tmp_path / "db.sqlite"), reuse_plan=False, workers="ray")
    r = cm.report_dict()
    assert len(killed) == 1
    w = r["workers"]
    assert w["units_lost"] == 1 and w["retried"] == 1 and w["failed"] == 0
    assert w["address"] == "this process's Ray" and not w["started_cluster"]
    dead = w["workers"][killed[0]]
    assert dead["alive"] is False and dead["units"] == 0 and len(w["workers"]) == 3  # replaced
    assert w["units"] >= 2
    # the lost unit's verdict came from its retry: every kernel checked, none an error
    assert r["max_rel_error"] is not None and r["max_rel_error"] < 1e-5
    assert r["candidates_rejected"] == 0 and "budget" not in r["stopped_because"]
    art = tmp_path / "small.lumc"          # the artifact runs and agrees with onnxruntime
    cm.save(art)
    x = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    c = compare_output(np.asarray(lumc.load(art)(x)), want, 1e-5)
    assert c.ok, (c.max_rel, c.note)


@driver_only
def test_pool_faults_and_data(ray_cluster):
    """Units lost twice fail and the pool goes on; a unit's own error is its result; an array is
    put once however many units read it."""
    pool = RayWorkers(parse_workers("ray"), resolve_target("sim:h200"))
    try:
        assert pool.count == 2 and not pool.started_cluster
        dies = pool.submit_call(os._exit, (3,))
        with pytest.raises(WorkerLost, match="2 times"):
            dies.result(timeout=60)
        assert (pool.lost, pool.retried, pool.failed) == (2, 1, 1)
        assert pool.submit_call(operator.add, (2, 3)).result(timeout=60) == 5   # replacements
        with pytest.raises(ZeroDivisionError):
            pool.submit_call(operator.truediv, (1, 0)).result(timeout=60)
        assert pool.lost == 2                   # an exception is not a lost worker
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        futs = [pool.submit_call(np.stack, (), [a, a]) for _ in range(3)]
        for f in futs:
            np.testing.assert_array_equal(f.result(timeout=60), np.stack([a, a]))
        assert len(pool._puts) == 1
        rep = pool.report()
        assert rep["units_lost"] == 2 and rep["failed"] == 1 and rep["units"] == 5
    finally:
        pool.close()


@driver_only
def test_pool_hung_unit_and_close(ray_cluster):
    """A unit past ``unit_timeout_s`` has its actor killed and is retried once, then fails;
    ``close`` cancels what is queued and running at once."""
    pool = RayWorkers(parse_workers("ray"), resolve_target("sim:h200"), unit_timeout_s=1.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerLost, match="no result after 1.5 s"):
            pool.submit_call(time.sleep, (60,)).result(timeout=60)
        assert time.monotonic() - t0 < 30 and pool.retried == 1
        pool.unit_timeout_s = 600
        futs = [pool.submit_call(time.sleep, (60,)) for _ in range(4)]
        while pool.status()["busy"] < 2:
            time.sleep(0.05)
        t0 = time.monotonic()
        pool.close()
        assert all(f.done() for f in futs) and time.monotonic() - t0 < 10
        assert sum(f.cancelled() for f in futs) == 2      # the queued two; the running two fail
    finally:
        pool.close()


@pytest.mark.slow
def test_ray_client_address(ray_cluster, tmp_path):
    """``--workers ray://HOST:PORT``: the compile reaches the cluster through Ray Client (a
    client server started here on the module's cluster) and its units run there."""
    import socket
    import onnx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "ray.util.client.server", "--mode", "legacy",
                               "--address", ray_cluster, "--host", "127.0.0.1", "--port",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):                  # until the server listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        model = tmp_path / "small.onnx"
        onnx.save(small_model(), model)
        r = lumc_compile(model, [], f"ray://127.0.0.1:{port}", tmp_path, "")
        w = r["workers"]
        assert w["kind"] == "ray" and w["address"] == f"ray://127.0.0.1:{port}"
        assert w["count"] == 2 and w["units"] >= 2 and not w["started_cluster"]
        assert r["max_rel_error"] is not None and r["max_rel_error"] < 1e-5
    finally:
        server.terminate()
        server.wait(timeout=30)


def _raylets() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid,comm"], capture_output=True, text=True).stdout
    return {int(line.split()[0]) for line in out.splitlines()[1:] if line.split()[1:] == ["raylet"]}


@pytest.mark.slow
def test_ray_without_address_starts_and_stops_a_cluster(ray_cluster, tmp_path):
    """``--workers ray`` with no ``RAY_ADDRESS``: the compile starts a local cluster of this
    machine's cores, runs its units there, and shuts it down before it exits."""
    import onnx
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    before = _raylets()
    assert before                             # the module's cluster has one
    env_address = os.environ.pop("RAY_ADDRESS", None)
    try:
        r = lumc_compile(model, [], "ray", tmp_path, "")
    finally:
        if env_address is not None:
            os.environ["RAY_ADDRESS"] = env_address
    w = r["workers"]
    assert w["started_cluster"] is True and w["address"] == "local"
    assert w["count"] == os.cpu_count() and w["units"] >= 2
    assert r["max_rel_error"] is not None and r["max_rel_error"] < 1e-5
    assert _raylets() <= before               # its raylet is gone; the module's cluster stays


def _stale_ray_tmpdir() -> str:
    """A short ``RAY_TMPDIR`` (Ray's socket paths must fit 107 bytes) whose
    ``ray/ray_current_cluster`` names a cluster that died: nothing listens at its address."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="lr", dir="/tmp")
    os.makedirs(os.path.join(tmp, "ray"))
    with open(os.path.join(tmp, "ray", "ray_current_cluster"), "w") as f:
        f.write(f"127.0.0.1:{_free_port()}")
    return tmp


def test_no_address_never_joins_a_stale_recorded_cluster(monkeypatch):
    """Without an address ``ray.init`` is told ``address="local"``: Ray's own resolution then
    starts a new cluster, where a bare call resolves to the dead cluster a ``ray start`` left in
    ``ray_current_cluster`` (and refuses ``num_cpus``: the error users saw)."""
    import shutil

    from ray._private.services import canonicalize_bootstrap_address

    from lumc.compiler.core.ray_workers import ray_init_kwargs
    tmp = _stale_ray_tmpdir()
    try:
        monkeypatch.setenv("RAY_TMPDIR", tmp)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        stale = open(os.path.join(tmp, "ray", "ray_current_cluster")).read()
        joined = canonicalize_bootstrap_address(None)       # the trap is set (Ray names
        assert joined.rsplit(":", 1)[1] == stale.rsplit(":", 1)[1]   # 127.0.0.1 by the node IP)
        kw = ray_init_kwargs(None, 3)
        assert canonicalize_bootstrap_address(kw["address"]) is None    # a new local cluster
        assert kw["num_cpus"] == 3 and kw["include_dashboard"] is False
        assert ray_init_kwargs("ray://h:10001")["address"] == "ray://h:10001"
        assert "num_cpus" not in ray_init_kwargs("10.0.0.1:6379")
    finally:
        shutil.rmtree(tmp)


@pytest.mark.slow
def test_ray_without_address_past_a_stale_cluster_record(tmp_path):
    """``--workers ray`` with no ``RAY_ADDRESS`` while ``ray_current_cluster`` names a dead
    cluster: the compile starts its own local cluster, runs its units there and leaves the
    record file as it found it."""
    import shutil

    import onnx
    tmp = _stale_ray_tmpdir()
    record = os.path.join(tmp, "ray", "ray_current_cluster")
    stale = open(record).read()
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=tmp, LUMC_CACHE_DIR=str(tmp_path / "cache"))
    try:
        r = subprocess.run([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()",
                            "compile", str(model), "--budget", "120s", "--device", "sim:h200",
                            "-o", str(tmp_path / "out.lumc"), "--report", str(tmp_path / "r.json"),
                            "--quiet", "--workers", "ray"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        w = json.loads((tmp_path / "r.json").read_text())["workers"]
        assert w["started_cluster"] is True and w["address"] == "local"
        assert w["count"] == os.cpu_count() and w["units"] >= 1
        assert open(record).read() == stale
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_unreachable_address_fails_at_once(tmp_path):
    """``--workers ray://127.0.0.1:PORT`` where nothing listens: exit 2 within seconds with one
    line naming the address and the reason (it used to wait out Ray Client's 30 s of retries,
    past the budget, and report the budget as too small)."""
    import onnx

    from lumc.compiler.core.ray_workers import probe_address
    from lumc.ir.errors import InputError
    port = _free_port()
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    env = {**os.environ, "LUMC_CACHE_DIR": str(tmp_path / "cache")}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", "from lumc.compiler.tools.cli import main; main()",
                        "compile", str(model), "--budget", "20s", "--device", "sim:h200",
                        "-o", str(tmp_path / "out.lumc"), "--quiet",
                        "--workers", f"ray://127.0.0.1:{port}"],
                       capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"lumc: error: --workers ray://127.0.0.1:{port}: cannot reach the "
                                f"Ray cluster at ray://127.0.0.1:{port} (Connection refused)")
    assert took < 15 and not (tmp_path / "out.lumc").exists()
    with pytest.raises(InputError, match=r"workers='ray': cannot reach the Ray cluster at "
                                         rf"127\.0\.0\.1:{port} \(Connection refused\)"):
        probe_address("ray", f"127.0.0.1:{port}")     # a GCS address (RAY_ADDRESS) alike
    probe_address("ray", "auto")                      # not HOST:PORT: left to Ray
