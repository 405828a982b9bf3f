#!/bin/bash
# One-shot device run of experiments/scorer_throughput.py (real-size scorers, random weights) on the
# lent GPU machine. Run from the repo root there, e.g. with the run tool:
#   command: bash scripts/device_scorer_throughput.sh      carry: [".wheelhouse"]   timeout_s: 560
# (or carry ".whl", whichever folder ../shared/tools/device-wheelhouse.sh filled; only open_clip and
# its ftfy/wcwidth are needed here). Results: $OUT/scorer_throughput.json (rewritten after every scorer,
# so a time-out keeps the finished ones) and $OUT/scorer_throughput.log.
# Expected cost on an H200: ~4 GB of random weight files written, ~3-5 minutes in all (setup dominates:
# ViT-H-14 and BLIP-L are built on the CPU by the evaluators, as in a real run). Knobs via env:
#   SCORERS (default below; hpsv2_amp last because it only re-times HPS with fp16 autocast),
#   IMAGES (64), BATCH (16), LIMIT_S (python's own time limit, 500); DEVICE=cpu SIZE=tiny IMAGE_SIZE=64
#   dry-runs the plumbing on a CPU box.
set -uo pipefail
OUT=${OUT:-results}
PY=${PYTHON:-python3}
SCORERS=${SCORERS:-hpsv2,imagereward,geneval,fidelity,hpsv2_amp}
mkdir -p "$OUT"
log="$OUT/scorer_throughput.log"

if ! "$PY" -c "import open_clip" 2>/dev/null; then
  for d in .wheelhouse .whl; do
    if compgen -G "$d/*.whl" >/dev/null; then
      echo "installing wheels from $d" | tee -a "$log"
      "$PY" -m pip install -q --no-index --no-deps --target .site "$d"/*.whl 2>&1 | tail -3 | tee -a "$log"
      export PYTHONPATH="$PWD/.site${PYTHONPATH:+:$PYTHONPATH}"
      break
    fi
  done
fi
"$PY" -c "import open_clip, ftfy" 2>>"$log" || {
  echo "open_clip not importable: carry a wheelhouse (.wheelhouse/ or .whl/, built by ../shared/tools/device-wheelhouse.sh)" | tee -a "$log"
  exit 2
}

# weight files on tmpfs when it has room (fast writes); else the default temp dir
work=""
if [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2{print $4}')" -gt $((12 * 1024 * 1024)) ]; then
  work=$(mktemp -d /dev/shm/scorer_tp.XXXXXX)
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee -a "$log"

args=(--device "${DEVICE:-cuda}" --size "${SIZE:-real}" --image-size "${IMAGE_SIZE:-1024}" --scorers "$SCORERS" --images "${IMAGES:-64}" --batch "${BATCH:-16}"
      --out "$OUT/scorer_throughput.json")
[ -n "$work" ] && args+=(--workdir "$work")
timeout "${LIMIT_S:-500}" "$PY" -u -m experiments.scorer_throughput "${args[@]}" 2>&1 \
  | grep --line-buffered -v "No pretrained weights loaded" | tee -a "$log"
rc=${PIPESTATUS[0]}
[ -n "$work" ] && rm -rf "$work"
echo "exit $rc" | tee -a "$log"
exit "$rc"
