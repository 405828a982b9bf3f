#!/bin/bash
# The first GPU run in one command (issue 37): the `gpu` tests, then the device bench ordered by value, in
# about 9 minutes, keeping whatever finished when it is cut short. Run from the repo root on the lent
# machine, e.g. with the run tool:
#   command: bash scripts/device_check.sh      carry: [".whl"]      timeout_s: 580
# Before that, once, on this machine: `bash scripts/device_check.sh --wheelhouse .whl` downloads the six
# wheels the image lacks and the package needs (hydra-core, omegaconf, antlr4 runtime, open_clip, ftfy,
# wcwidth: ~2.7 MB; `varbench/__init__` imports omegaconf, so they are not optional). A full wheelhouse
# (../shared/tools/device-wheelhouse.sh) works too, but 26 MB of it leaves the 64 MiB carry almost full.
#
# What runs, in this order (each part under its own `timeout`; estimates printed by the bench's plan):
#   1. install: the six wheels into .site (no index, no deps), PYTHONPATH=.site:.          (~10 s)
#   2. the named `gpu` test files (pytest -m gpu, TESTS_S, default 100 s)                  (~60-100 s)
#   2b. the entropy kernel's launch configurations timed against SDPA (GPU only, <= 45 s)  (~10 s)
#   3. experiments.device_bench under the rest of LIMIT_S: 2B/8B batch-1 baseline and methods (eager vs
#      graphed, bit checks), HART, then batch 8; configurations whose predicted peak exceeds the device's
#      memory are not planned (a row says why); the JSON and markdown are rewritten after every item's
#      section, so a kill loses at most the section in flight. Every row records the runtime's fallbacks.
# Outputs in $OUT when set (the run tool's returned folder), else results/curated/: device_bench.json,
# device_bench.md, gpu_tests.log, kernel_configs.log (GPU), device_check.log.
# Knobs via env: LIMIT_S (whole command, default 540), TESTS_S (100), WHEELS (.whl), PYTHON (python3),
# VARBENCH_GIT_SHA (recorded when the device copy has no .git). Extra arguments go to the bench, e.g.
#   bash scripts/device_check.sh --models 2b,hart --repeats 7
#   OUT=/tmp/dc LIMIT_S=200 bash scripts/device_check.sh --smoke     (CPU, tiny models: the plumbing)
set -uo pipefail
SLIM=(hydra-core==1.3.8 omegaconf==2.3.1 open-clip-torch==3.3.0 ftfy wcwidth)
if [ "${1:-}" = "--wheelhouse" ]; then   # on the host: download the slim set (the image is Python 3.12, x86-64)
  dir=${2:-.whl}
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$dir" "${SLIM[@]}"
  # antlr4-python3-runtime 4.9.3 (omegaconf 2.3's) is published as source only: build its pure wheel here
  ls "$dir"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 || python3 -m pip wheel -q --no-deps -w "$dir" antlr4-python3-runtime==4.9.3
  du -sh "$dir"
  exit 0
fi
DEST=${OUT:-results/curated}
PY=${PYTHON:-python3}
LIMIT_S=${LIMIT_S:-540}
TESTS_S=${TESTS_S:-100}
WHEELS=${WHEELS:-.whl}
# the files that hold `gpu` tests: named, so pytest collects these and not the whole suite (~130 s)
GPU_TESTS=(tests/engine/test_cuda_graphs.py tests/engine/test_flash_entropy.py tests/engine/test_hart_runtime.py
           tests/experiments/test_device_bench.py tests/evaluators/test_eval_geneval.py)
mkdir -p "$DEST"
log="$DEST/device_check.log"
: >"$log"
t0=$(date +%s)
say() { echo "[device_check $(( $(date +%s) - t0 ))s] $*" | tee -a "$log"; }

# 1. install
wheels=()
for name in hydra_core omegaconf antlr4_python3_runtime open_clip_torch ftfy wcwidth; do
  w=$(ls "$WHEELS"/${name}-*.whl 2>/dev/null | head -1)
  [ -n "$w" ] && wheels+=("$w")
done
if [ ${#wheels[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --target .site "${wheels[@]}" 2>&1 | tail -3 | tee -a "$log"
  export PYTHONPATH="$PWD/.site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import varbench, omegaconf" 2>>"$log"; then
  say "varbench does not import (wheels found in $WHEELS: ${#wheels[@]} of 6); build them with: bash scripts/device_check.sh --wheelhouse $WHEELS"
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 | tee -a "$log"
say "installed ${#wheels[@]} wheels"

# 2. the gpu tests, their own time limit
timeout "$TESTS_S" "$PY" -m pytest -q -m gpu -p no:cacheprovider "${GPU_TESTS[@]}" >"$DEST/gpu_tests.log" 2>&1
trc=$?
say "gpu tests: exit $trc$([ $trc = 124 ] && echo ' (time limit)'): $(tail -1 "$DEST/gpu_tests.log")"

# 2b. the fused entropy kernel's default launch against the register sweep's candidates and SDPA's flash kernel
#     (experiments/flash_entropy_registers.py --time: ~10 s; the defaults change only on this evidence)
if command -v nvidia-smi >/dev/null; then
  timeout 45 "$PY" -m experiments.flash_entropy_registers --time >"$DEST/kernel_configs.log" 2>&1
  say "kernel configs: exit $? ($(grep -c 'SDPA flash' "$DEST/kernel_configs.log") shapes timed, $DEST/kernel_configs.log)"
fi

# 3. the bench, in what is left (20 s kept for the report below)
budget=$(( LIMIT_S - 20 - ($(date +%s) - t0) ))
say "bench budget ${budget}s"
timeout "$(( budget + 10 ))" "$PY" -u -m experiments.device_bench --out "$DEST" --budget-s "$budget" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && say "bench cut off: $DEST/device_bench.json has every finished section"
# measured peaks beside the fake-CUDA dry run's predictions
"$PY" - "$DEST/device_bench.json" <<'PYEOF' 2>&1 | tee -a "$log"
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:  # noqa: BLE001
    sys.exit(f"no peak comparison: {e}")
for r in rows:
    if r.get("peak_gib") is not None:
        p = r.get("predicted_peak_gib")
        print(f"peak {r['model_label']:12s} {r['method']:22s} b{r['batch']:<2} {r['mode']:8s} measured {r['peak_gib']:7.2f} GiB"
              f"  predicted {'%7.2f GiB' % p if p is not None else '   (none)'}")
PYEOF
say "exit: tests $trc, bench $rc"
[ "$trc" = 0 ] || [ "$trc" = 5 ] || exit 1
exit "$rc"
