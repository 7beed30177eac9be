#!/usr/bin/env bash
# make gpu-check: lumc's main job on a real GPU (H100/H200), in this one script, within 10 minutes.
#
#   1. pick a Python that has torch and triton (the GPU machine: Python 3.12, both preinstalled);
#   2. install what it lacks (numpy, ml_dtypes, onnx, onnxruntime, click, rich, pytest, ...) from the
#      wheels carried in build/wheels (`make gpu-wheels` fetches them where a registry is reachable),
#      into build/gpu-site/deps, never into the system site-packages; egglog is not needed (without
#      it a compile uses the greedy program, and the report says so);
#   3. make lumc importable without pip: build/gpu-site/pkg/lumc mirrors pyproject's package-dir
#      (lumc -> compiler/public, lumc.ir -> ir, ...) with symlinks;
#   4. without a CUDA device: render every benchmark case, print the plan below and stop, exit 2;
#   5. run every test marked gpu (tests/, bf16, split-K, cuDNN convolutions and the precompiled
#      first launch included; ~110 s);
#   6. the main job (python -m lumc.compiler.tools.gpu_main, ~7 min), over the e-graph candidates
#      `make gpu-candidates` wrote to build/gpu-candidates where egglog is (this image has none;
#      without them the compiles search the greedy program): the four README models (carried
#      in build/gpu-models, `make gpu-models`), GPT-2 small and BERT-base at seq 128 in fp32 and
#      bf16, then a 4-layer TinyLlama-size Llama in bf16 while time lasts: compile --device
#      cuda, run the plan through CUDA graphs checked against the float64 reference, bench
#      against torch eager and torch.compile(max-autotune); one table, written to
#      docs/gpu-results.md (date, device, versions) and build/gpu-check/gpu-main.json;
#   7. with the time left, the per-form kernel benchmark (build/gpu-check/gpu-check.json and .md).
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
        "pygments": "pygments", "hypothesis": "hypothesis", "sortedcontainers": "sortedcontainers",
        "onnx": "onnx", "google.protobuf": "protobuf", "onnxruntime": "onnxruntime",
        "flatbuffers": "flatbuffers", "click": "click", "rich": "rich",
        "markdown_it": "markdown-it-py", "mdurl": "mdurl", "networkx": "networkx"}
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
# the e-graph's candidates, made where egglog is (make gpu-candidates): this image has no egglog
if ls "$ROOT"/build/gpu-candidates/*.json >/dev/null 2>&1; then
    export LUMC_CARRIED_CANDIDATES="$ROOT/build/gpu-candidates"
    say "e-graph candidates carried for $(ls "$ROOT"/build/gpu-candidates/*.json | wc -l) models"
else
    say "no e-graph candidates carried (make gpu-candidates): compiles search the greedy program"
fi

# 4. no GPU: the CPU part only, the plan, then a clear stop (exit 2)
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    "$PY" -m lumc.backends.triton.gpu_check --json "$OUT/gpu-check.json"
    "$PY" -m lumc.compiler.tools.gpu_main --json "$OUT/gpu-main.json"
    exit $?
fi

# 5. the GPU tests (bf16 included), then the benchmark; compiled kernels, never the interpreter
#    (lumc picks the interpreter where it sees no NVIDIA device node, which some containers hide)
export TRITON_INTERPRET=0
say "device: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')"
timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests --junitxml "$OUT/gpu-tests.xml"
tests_rc=$?
say "gpu tests: exit $tests_rc ($(( $(date +%s) - t0 )) s so far)"
# 6. the main job, with most of what is left of the 10 minutes (570 s, leaving a margin)
left=$(( 570 - ($(date +%s) - t0) ))
main_budget=$(( left - 90 ))
[ "$main_budget" -lt 60 ] && main_budget=60
timeout $(( main_budget + 60 )) "$PY" -m lumc.compiler.tools.gpu_main --budget "$main_budget" \
    --json "$OUT/gpu-main.json" --markdown docs/gpu-results.md
main_rc=$?
say "main job: exit $main_rc ($(( $(date +%s) - t0 )) s so far)"
# 7. the per-form benchmark with what is left
left=$(( 570 - ($(date +%s) - t0) ))
bench_rc=0
if [ "$left" -ge 60 ]; then
    timeout "$left" "$PY" -m lumc.backends.triton.gpu_check --budget "$(( left - 30 ))" --no-compile \
        --json "$OUT/gpu-check.json" --markdown "$OUT/gpu-forms.md"
    bench_rc=$?
else
    say "per-form benchmark skipped: ${left} s left"
fi
say "done in $(( $(date +%s) - t0 )) s: tests exit $tests_rc, main job exit $main_rc, per-form exit $bench_rc; docs/gpu-results.md and $OUT/"
[ "$tests_rc" -eq 0 ] && [ "$main_rc" -eq 0 ]
