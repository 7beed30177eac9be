#!/usr/bin/env bash
# make gpu-check: the Triton backend on a real GPU (H100/H200), in one script, under 8 minutes.
#
#   1. pick a Python that has torch and triton (the GPU machine: Python 3.12, both preinstalled);
#   2. install what it lacks (numpy, ml_dtypes, platformdirs, pytest, hypothesis...) from the wheels
#      carried in build/wheels (`make gpu-wheels` fetches them where a registry is reachable), into
#      build/gpu-site/deps, never into the system site-packages; egglog is not needed here;
#   3. make lumc importable without pip: build/gpu-site/pkg/lumc mirrors pyproject's package-dir
#      (lumc -> compiler/public, lumc.ir -> ir, ...) with symlinks;
#   4. without a CUDA device: render every benchmark case (the CPU part) and stop, exit status 2;
#   5. run the tests marked gpu (bf16 included), then the per-form benchmark against torch eager and
#      torch.compile(max-autotune-no-cudagraphs), writing build/gpu-check/gpu-check.json and .md.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${GPU_CHECK_OUT:-build/gpu-check}
WHEELS=${GPU_CHECK_WHEELS:-build/wheels}
SITE=build/gpu-site
mkdir -p "$OUT" "$SITE"
export TRITON_DEFAULT_FP_FUSION=1
t0=$(date +%s)

say() { echo "gpu-check: $*"; }

# 1. a Python with torch and triton, preferring one that sees a GPU
PY=""
for cand in "${PYTHON:-}" python3 python .venv/bin/python; do
    [ -n "$cand" ] || continue
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if "$cand" -c "import torch, triton" >/dev/null 2>&1; then
        if [ -z "$PY" ]; then PY=$cand; fi
        if "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
                >/dev/null 2>&1; then PY=$cand; break; fi
    fi
done
if [ -z "$PY" ]; then
    say "STOP: no Python with torch and triton found (set PYTHON=...)"; exit 3
fi
say "python: $PY ($("$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'))"

# 2. what this Python lacks, from the carried wheels
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"numpy": "numpy", "ml_dtypes": "ml_dtypes", "platformdirs": "platformdirs",
        "pytest": "pytest", "iniconfig": "iniconfig", "pluggy": "pluggy", "packaging": "packaging",
        "pygments": "pygments", "hypothesis": "hypothesis", "sortedcontainers": "sortedcontainers"}
print(" ".join(w for m, w in need.items() if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        say "STOP: this Python lacks: $missing; no wheels in $WHEELS (run 'make gpu-wheels' where a"
        say "      package registry is reachable, and carry $WHEELS to this machine)"; exit 3
    fi
    say "installing from $WHEELS: $missing"
    "$PY" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" \
        --target "$SITE/deps" $missing || { say "STOP: wheel install failed"; exit 3; }
fi

# 3. lumc without pip: symlinks that mirror the package-dir mapping of pyproject.toml
rm -rf "$SITE/pkg" && mkdir -p "$SITE/pkg/lumc"
for f in "$ROOT"/compiler/public/*; do ln -s "$f" "$SITE/pkg/lumc/"; done
for d in ir backends compiler rewrites; do ln -s "$ROOT/$d" "$SITE/pkg/lumc/$d"; done
export PYTHONPATH="$ROOT/$SITE/pkg:$ROOT/$SITE/deps${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import lumc.backends.triton" || { say "STOP: lumc.backends.triton does not import"; exit 3; }

# 4. no GPU: the CPU part only, then a clear stop
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    "$PY" -m lumc.backends.triton.gpu_check --json "$OUT/gpu-check.json"
    exit $?
fi

# 5. the GPU tests (bf16 included), then the benchmark; compiled kernels, never the interpreter
#    (lumc picks the interpreter where it sees no NVIDIA device node, which some containers hide)
export TRITON_INTERPRET=0
say "device: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')"
timeout 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/backends/test_triton_gpu.py \
    --junitxml "$OUT/gpu-tests.xml"
tests_rc=$?
say "gpu tests: exit $tests_rc ($(( $(date +%s) - t0 )) s so far)"
left=$(( 450 - ($(date +%s) - t0) ))
[ "$left" -lt 60 ] && left=60
timeout $(( left + 30 )) "$PY" -m lumc.backends.triton.gpu_check --budget "$(( left - 60 ))" \
    --json "$OUT/gpu-check.json" --markdown "$OUT/gpu-results.md"
bench_rc=$?
say "done in $(( $(date +%s) - t0 )) s: tests exit $tests_rc, benchmark exit $bench_rc; results in $OUT/"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
