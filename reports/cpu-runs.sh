#!/usr/bin/env bash
# The CPU runs of reports/ in one go: the engine paths, a calibration (timed; it becomes this user's
# `local` calibration too), the fp32 profile with its accuracy report, and `simulate --validate`, all tagged TAG (e.g. 2026-11-25-cpu-avx2). Run it from the
# repository root on a quiet machine. AVX2=1 runs an AVX-512 machine as an AVX2-only one: llmperf's,
# torch's and oneDNN's switches hide AVX-512 and AMX (bf16 then has no native kernel).
#
#   reports/cpu-runs.sh 2026-11-25-cpu-avx2            # on an AVX2-only CPU
#   AVX2=1 reports/cpu-runs.sh 2026-11-25-cpu-avx2     # the same paths on an AVX-512 CPU
#   RUNS=1 ...                                         # profile's rounds of generations (default 3, `--runs`)
set -euo pipefail
tag=${1:?usage: reports/cpu-runs.sh TAG}
threads=${THREADS:-2}
if [ "${AVX2:-0}" = 1 ]; then
    export LLMPERF_MAX_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
fi
py=${PYTHON:-python}
cal=reports/calibrate/$tag.yaml
$py -m llmperf.engine.paths | tee "reports/calibrate/$tag.log"
SECONDS=0
# without -o: the user's `local` calibration, which `simulate --validate` prices with; a copy is the record
$py -m llmperf.cli calibrate --device cpu --threads "$threads" 2>&1 | tee -a "reports/calibrate/$tag.log"
echo "calibrate: ${SECONDS} s wall" | tee -a "reports/calibrate/$tag.log"
cp "$($py -c 'from llmperf.specs.local import local_path; print(local_path())')" "$cal"
$py -m llmperf.cli profile reports/profile/llama-style-cpu.yaml --device cpu --threads "$threads" --dtype fp32 \
    -H "$cal" -b 1,4,16 -p 64,512,2048 -g 16 --runs "${RUNS:-3}" -o "reports/profile/$tag"
$py -m llmperf.measure.accuracy "reports/profile/$tag" --save
$py -m llmperf.cli simulate --validate --run-dir "reports/simulate/$tag"
