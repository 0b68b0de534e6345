#!/usr/bin/env bash
# One command for a GPU session: calibrate + profile (Triton, then SDPA if time allows) + accuracy +
# the kernel benchmark, everything written under OUT (logs included). About 5-8 minutes on an H100.
#
#   reports/profile/gpu.sh OUT                 # CUDA: the full run (the committed GPU run's settings)
#   reports/profile/gpu.sh OUT --device cpu    # a small CPU dry run of the same steps: catches typos,
#                                              # its figures mean nothing
#
# Run from anywhere; it works from the repository root and puts it on PYTHONPATH. Files:
#   OUT/calibrate.yaml, calibrate.log        the calibrated hardware spec (-H for the profiles)
#   OUT/profile-<backend>/                   run.json, ops.csv, steps.csv, generations.csv,
#                                            accuracy.txt, profile.log
#   OUT/kernels/, kernels.log                the kernel benchmark (--quick; --dry-run on CPU)
#   OUT/timings.txt                          seconds each step took
set -euo pipefail

usage() { echo "usage: $0 OUT [--device cuda|cpu]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
OUT=$1; shift
DEVICE=cuda
while [[ $# -gt 0 ]]; do
    case $1 in
        --device) [[ $# -ge 2 ]] || usage; DEVICE=$2; shift 2 ;;
        *) usage ;;
    esac
done
[[ $DEVICE == cuda || $DEVICE == cpu ]] || usage

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}  # the SDPA profile is skipped once this much of the session is spent
: > "$OUT/timings.txt"

step() {  # step NAME LOG CMD...: run, tee the log, record the seconds
    local name=$1 log=$2; shift 2
    local t0=$SECONDS
    echo "== $name: $*" | tee -a "$OUT/timings.txt"
    "$@" 2>&1 | tee "$log"
    echo "   $name: $((SECONDS - t0)) s" | tee -a "$OUT/timings.txt"
}

if [[ $DEVICE == cuda ]]; then
    CAL=(--device cuda)
    MODEL=(llama-3.1-8b --layers 4 --device cuda --dtype bf16 -b 1,8,32 -p 512,2048 -g 32)
    BACKENDS=(triton sdpa)
    KBENCH=(--quick)
else  # small: the same code paths in seconds (Triton is not timed on CPU: sdpa and naive)
    CAL=(--device cpu --quick --threads 1)
    MODEL=(reports/profile/llama-style-cpu.yaml --layers 1 --device cpu --threads 1 --dtype fp32 -b 1,2 -p 16 -g 4
           --reps 1 --separate-step-run)
    BACKENDS=(sdpa naive)
    KBENCH=(--quick --dry-run)
fi

step calibrate "$OUT/calibrate.log" "$PY" -m llmperf.cli calibrate "${CAL[@]}" -o "$OUT/calibrate.yaml"
for backend in "${BACKENDS[@]}"; do
    if [[ $backend != "${BACKENDS[0]}" && $SECONDS -gt $((BUDGET_S / 2)) ]]; then
        echo "   profile-$backend skipped: $SECONDS s spent (budget $BUDGET_S s)" | tee -a "$OUT/timings.txt"
        continue
    fi
    dir="$OUT/profile-$backend"
    mkdir -p "$dir"
    step "profile-$backend" "$dir/profile.log" "$PY" -m llmperf.cli profile "${MODEL[@]}" --backend "$backend" \
        -H "$OUT/calibrate.yaml" -o "$dir"
    step "accuracy-$backend" "$dir/accuracy.log" "$PY" -m llmperf.measure.accuracy "$dir" --save
done
step kernels "$OUT/kernels.log" "$PY" -m llmperf.measure.kernel_bench "${KBENCH[@]}" --out "$OUT/kernels"
echo "done in $SECONDS s: $OUT" | tee -a "$OUT/timings.txt"
