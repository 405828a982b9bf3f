#!/bin/bash
# One-shot GPU benchmark of Infinity-2B/8B (random weights, 1024², cfg 4) and every method's default
# preset, plus HART-0.7B (random weights, 1024², fp16 autocast, batch 1: baseline vs FastVAR's HART port vs
# SkipLast(-2), ~20-40 s of the budget): experiments/device_bench.py (what and how: its docstring). Run from the repo root on the lent
# H200, e.g. with the run tool:
#   command: bash scripts/device_bench.sh      carry: [".wheelhouse"]      timeout_s: 540
# (or carry ".whl": whichever folder ../shared/tools/device-wheelhouse.sh or `scripts/device_check.sh
# --wheelhouse` filled; the wheels are required: `varbench/__init__` imports omegaconf). For the first run on
# a lent device use scripts/device_check.sh: the gpu tests first, then this bench, in one command that fits.
# Outputs: device_bench.json, device_bench.md and device_bench.log in $OUT when set (the run tool's
# returned folder), else results/curated/. The JSON and markdown are rewritten after every section, so a
# time-out keeps what finished. Whole run < 8 minutes: install (~10 s) + the script's own budget
# (LIMIT_S - 40 s; it skips what would not fit) under `timeout LIMIT_S`.
# Knobs via env: LIMIT_S (default 470), PYTHON (python3), VARBENCH_GIT_SHA (the commit, recorded when the
# device copy of the tree has no .git: prefix the command with VARBENCH_GIT_SHA=<sha>). Extra arguments go to the script, e.g.
#   bash scripts/device_bench.sh --models 2b --repeats 7
#   bash scripts/device_bench.sh --smoke      (CPU, tiny models: the plumbing; pass OUT=... to keep it apart)
set -uo pipefail
DEST=${OUT:-results/curated}
PY=${PYTHON:-python3}
LIMIT_S=${LIMIT_S:-470}
mkdir -p "$DEST"
log="$DEST/device_bench.log"
: >"$log"
t0=$(date +%s)

if ! "$PY" -c "import omegaconf" 2>/dev/null; then
  installed=""
  for d in .wheelhouse .whl; do
    if compgen -G "$d/*.whl" >/dev/null; then
      echo "installing wheels from $d" | tee -a "$log"
      "$PY" -m pip install -q --no-index --no-deps --target .site "$d"/*.whl 2>&1 | tail -3 | tee -a "$log"
      export PYTHONPATH="$PWD/.site${PYTHONPATH:+:$PYTHONPATH}"
      installed=$d
      break
    fi
  done
  [ -z "$installed" ] && echo "no wheelhouse (.wheelhouse/ or .whl/): varbench needs omegaconf; build one with bash scripts/device_check.sh --wheelhouse .whl" | tee -a "$log"
fi
# the package itself, editable, no dependencies (offline: no build isolation); the repo root on
# PYTHONPATH covers an image whose pip cannot do it
"$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3 | tee -a "$log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import varbench, yaml" 2>>"$log" || { echo "varbench or PyYAML not importable" | tee -a "$log"; exit 2; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 | tee -a "$log"
budget=$((LIMIT_S - 40 - ($(date +%s) - t0)))
echo "install took $(( $(date +%s) - t0 ))s; script budget ${budget}s under timeout ${LIMIT_S}s" | tee -a "$log"

timeout "$LIMIT_S" "$PY" -u -m experiments.device_bench --out "$DEST" --budget-s "$budget" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
# measured peak beside the fake-CUDA dry run's prediction (results/curated/gpu_dryrun.json, made on a
# CPU with `python -m experiments.gpu_dryrun --json results/curated/gpu_dryrun.json`)
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
[ "$rc" = 124 ] && echo "timed out after ${LIMIT_S}s: $DEST/device_bench.json has every finished section" | tee -a "$log"
echo "exit $rc after $(( $(date +%s) - t0 ))s; outputs: $DEST/device_bench.json $DEST/device_bench.md $log" | tee -a "$log"
exit "$rc"
