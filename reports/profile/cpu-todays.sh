#!/usr/bin/env bash
# Today's families profiled on a CPU, each measurement beside its predictions: one calibration, then a
# Qwen3 (qwen3-8b), a Gemma 3 (gemma-3-27b: 5 sliding : 1 full layers), a Qwen3-MoE (qwen3-30b-a3b:
# 128 experts, top-8), a gpt-oss (gpt-oss-20b: sliding/full, sinks, 32 experts, top-4) at their real
# widths, and DeepSeek-V3 (MLA and MoE) at a quarter of its widths with every count kept
# (reports/profile/deepseek-v3-quarter-cpu.yaml says how: one real MoE layer is 45 GB at fp32), each
# cut to LAYERS layers (`--layers` keeps the first layer of each kind: Gemma 3's layers 0 and 5,
# DeepSeek's dense layer 0 and MoE layer 3), fp32, into reports/profile/TAG-cpu-MODEL/ with its
# accuracy report (accuracy.txt). Run it from the repository root on a quiet machine: the figures of
# a busy one are not worth committing. Each run holds its weights in memory, at fp32 and 2 layers:
# qwen3-8b 6.5 GB, gemma-3-27b 8.9 GB, qwen3-30b-a3b 7.5 GB, gpt-oss-20b 11.2 GB, the DeepSeek 4.8 GB.
#
#   reports/profile/cpu-todays.sh 2026-11-27                         # calibrate, then profile each model
#   MODELS="qwen3-8b" reports/profile/cpu-todays.sh 2026-11-27       # some of them
#   RUNS=1 reports/profile/cpu-todays.sh 2026-11-27                  # one round of generations (default 3: each
#       step the median of 3 interleaved rounds, `profile --runs`)
#   QUICK=1 OUT=/tmp/todays reports/profile/cpu-todays.sh check      # the smallest setting: checks the
#       script end to end (a seconds-long calibration, one short generation each); the figures mean nothing
set -euo pipefail
tag=${1:?usage: reports/profile/cpu-todays.sh TAG}
threads=${THREADS:-2}
layers=${LAYERS:-2}
py=${PYTHON:-python}
out=${OUT:-reports}
models=${MODELS:-qwen3-8b gemma-3-27b qwen3-30b-a3b gpt-oss-20b reports/profile/deepseek-v3-quarter-cpu.yaml}
if [ "${QUICK:-0}" = 1 ]; then
    calibrate_args=(--quick)
    sizes=(-b 2 -p 16 -g 4 --reps 1)
else
    calibrate_args=()
    sizes=(-b 1,4 -p 64,512 -g 16 --runs "${RUNS:-3}")
fi
mkdir -p "$out/calibrate" "$out/profile"
cal=$out/calibrate/$tag-cpu-todays.yaml
SECONDS=0
$py -m llmperf.cli calibrate --device cpu --threads "$threads" --dtypes fp32 --no-allreduce "${calibrate_args[@]}" \
    -o "$cal" 2>&1 | tee "$out/calibrate/$tag-cpu-todays.log"
echo "calibrate: ${SECONDS} s wall" | tee -a "$out/calibrate/$tag-cpu-todays.log"
for model in $models; do
    name=$(basename "$model" .yaml)
    dir=$out/profile/$tag-cpu-${name%-cpu}
    SECONDS=0
    $py -m llmperf.cli profile "$model" --layers "$layers" --device cpu --threads "$threads" --dtype fp32 -H "$cal" \
        "${sizes[@]}" -o "$dir"
    echo "profile $model: ${SECONDS} s wall"
    $py -m llmperf.measure.accuracy "$dir" --save
    # every measured operator joined to its prediction and every check exact, or the run is not worth keeping
    $py - "$dir" <<'PY'
import json, sys
run = json.load(open(f"{sys.argv[1]}/run.json"))
bad = [c["name"] + ": " + c["detail"] for c in run["checks"] if not c["passed"]]
if run["status"] != "complete" or bad:
    sys.exit(f"{sys.argv[1]}: status {run['status']}; failed: {bad}")
PY
done
