"""The sim check pool's forked workers run torch after the parent used torch's OpenMP pool.

GNU OpenMP is not fork-safe: a process forked after its parent ran a parallel region hangs in its
first own parallel region. A worker pre-fills a large output (``sampled._filled``, a parallel
``fill_``), so a compile whose process had run any large torch op before (a test session, a
notebook, a second compile) waited out its whole budget on its first large check. The child
script below does exactly that, in a fresh process so the parent's state is known."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    from lumc.compiler.core.check_pool import CheckPool
    from lumc.compiler.core.fusion import greedy_program
    from lumc.ir import dtypes as dt
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.tensor import Tensor

    n = 1 << 22
    torch.empty(n, dtype=torch.int64).fill_(3)       # the parent runs an OpenMP parallel region
    assert torch.get_num_threads() > 1
    x = Tensor(input_node("x", (n,), dt.f32))
    (call,) = greedy_program(Graph({"x": x.node}, {"y": (x * 2.0).node})).calls
    pool = CheckPool(workers=1)
    try:
        xs = np.arange(n, dtype=np.float32)
        outs, written, note = pool.submit(call.kernel, {"BLOCK": 1024, "num_warps": 4,
                                                        "num_stages": 1}, [xs]).result(timeout=90)
        w = written[0]
        assert w.any() and note.startswith("on 32 of"), note
        np.testing.assert_array_equal(outs[0][w], 2.0 * xs[w])
        print("ok", note)
    finally:
        pool.close()
""")


def test_a_worker_forked_after_a_parallel_region_runs_its_check():
    import os
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "2"}
    env.pop("LUMC_TEST_EXIT_GRACE_S", None)
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300,
                       env=env, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and r.stdout.startswith("ok on 32 of"), (r.stdout, r.stderr[-2000:])
