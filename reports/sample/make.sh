#!/usr/bin/env bash
# Regenerate the sample report: a profile of a small Llama-style model on this CPU, a simulated A100
# serving run, and an estimate, drawn into reports/sample/report.html (+ report_files/).
# Takes a few minutes on 2 cores (the first profile on a machine calibrates it first, ~2 minutes more).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=reports/sample
rm -rf "$out/profile-cpu" "$out/simulate-a100"
python -m llmperf.cli profile reports/profile/llama-style-cpu.yaml --device cpu --threads 2 \
    -b 1,4 -p 64 -g 8 --reps 3 -o "$out/profile-cpu" > "$out/profile-cpu.txt"
python -m llmperf.cli simulate llama-3.1-8b -H a100-80gb-sxm -n 300 --rate 20 --slo-ttft 0.5 --slo-tpot 0.05 \
    --find-max-rate --run-dir "$out/simulate-a100" > "$out/simulate-a100.txt"
python -m llmperf.cli report "$out/profile-cpu" "$out/simulate-a100" \
    -m llama-3.1-8b -H a100-80gb-sxm -b 1,8,64,256 -p 512,4096 -g 128 --compare a100-80gb-sxm,h100-sxm,h200,local \
    --title "llmperf sample report: estimate, CPU profile, simulated A100 serving" -o "$out/report.html"
