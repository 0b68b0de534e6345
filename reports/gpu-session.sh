#!/usr/bin/env bash
# Everything a lent GPU should check, in one prepared command that fits a short lease (about 9.5 minutes
# on an H100; each session's record: reports/gpu-session/README.md), each step under its own time limit.
# The timed steps come first, on a quiet host; the tests, whose workers compile kernels on every core, last:
#   1. reports/profile/gpu.sh: calibrate, profile Llama-3.1-8B on Triton (SDPA only if time allows: the
#      budget below skips it), accuracy, the kernel benchmark
#   2. the kernels' input checks on the GPU (tests/kernels/test_validation.py: seconds)
#   3. speculative decoding on the engine beside its prediction (llmperf.measure.speculative, bf16, Triton,
#      a warm-up run per k), priced by step 1's calibration
#   4. today's families on the GPU against transformers on the same GPU (tests/engine/test_cuda_families.py),
#      and tensor parallelism's NCCL ranks (one a GPU: a world of one on a one-GPU machine)
#   5. the MLA decode kernel's full shape set (kernel_bench --ops mla: batch 1-64, context 1k-32k, TP 1 and 8)
#   6. today's models profiled on the GPU with the calibration of step 1 (Triton backend, bf16, 2 layers
#      each kind kept): qwen3-30b-a3b, gpt-oss-20b, DeepSeek-V3 at a quarter of its widths, while time is left
#   7. the Triton kernels' tests on the GPU (windows, chunks, sinks, MLA decode; pytest-xdist when present),
#      while time is left
# Results go to R (default /tmp/gpu-session); after every step they are packed into OUT/gpu-session.tar.gz
# (OUT: the device tool's folder, or a second argument), so a run cut off at its limit still returns
# what finished. env.txt names the device, driver and versions; steps.txt each step's seconds and status.
# Each step runs in its own process group, killed whole when the step ends. The tests compile one
# kernel config per shape (LLMPERF_TRITON_AUTOTUNE=0, tests/conftest.py); the benchmarks autotune.
#
#   bash reports/gpu-session.sh                    # on the lent machine, from the repository root
#   DEADLINE_S=300 bash reports/gpu-session.sh     # stop starting steps after 300 s
#   SKIP_STEPS='^(profile|accuracy)-' bash ...     # skip the steps whose names match (a bash regex)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
R=${R:-/tmp/gpu-session}
PACK=${1:-${OUT:-$R}}
DEADLINE_S=${DEADLINE_S:-560}
PY=${PYTHON:-python3}
mkdir -p "$R" "$PACK"
: > "$R/steps.txt"

pack() { tar czf "$PACK/gpu-session.tar.gz.part" -C "$R" . && mv "$PACK/gpu-session.tar.gz.part" "$PACK/gpu-session.tar.gz"; }

step() {  # step NAME LIMIT_S CMD...: skipped past the deadline; else run under its limit, log, pack
    local name=$1 limit=$2; shift 2
    local left=$((DEADLINE_S - SECONDS))
    if [[ -n ${SKIP_STEPS:-} && $name =~ $SKIP_STEPS ]]; then
        echo "$name: skipped (SKIP_STEPS)" | tee -a "$R/steps.txt"
        return
    fi
    if (( left < 20 )); then
        echo "$name: skipped ($SECONDS s spent, deadline $DEADLINE_S s)" | tee -a "$R/steps.txt"
        return
    fi
    (( limit > left )) && limit=$left
    local t0=$SECONDS
    echo "== $name (limit $limit s): $*"
    setsid timeout --signal=INT --kill-after=10 "$limit" "$@" > "$R/$name.log" 2>&1 &
    local pid=$!
    wait "$pid"
    local rc=$?
    # a step cut off leaves nothing running behind it (pytest-xdist's workers compiling kernels would
    # load the host while the next step times a host-bound engine)
    kill -KILL -- "-$pid" 2>/dev/null
    tail -n 25 "$R/$name.log"
    echo "$name: rc $rc, $((SECONDS - t0)) s" | tee -a "$R/steps.txt"
    pack
}

{
    date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi; nproc
    "$PY" -c 'import sys, torch, triton, transformers; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda); print("triton", triton.__version__); print("transformers", transformers.__version__); p = torch.cuda.get_device_properties(0); print(p.name, p.multi_processor_count, "SMs", p.total_memory >> 20, "MiB")'
} > "$R/env.txt" 2>&1
cat "$R/env.txt"
XDIST=() TIMEOUT=()
"$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n 8)
"$PY" -c 'import pytest_timeout' 2>/dev/null && TIMEOUT=(--timeout 100)

# gpu.sh skips its SDPA profile past half its budget: 300 s leaves the kernel benchmark its time
BUDGET_S=${GPU_SH_BUDGET_S:-300} step gpu-sh 320 bash reports/profile/gpu.sh "$R/gpu"
step validation-tests 45 "$PY" -m pytest tests/kernels/test_validation.py -q -p no:cacheprovider "${TIMEOUT[@]}" \
    --junitxml "$R/validation-tests.xml"
[[ -f $R/gpu/calibrate.yaml ]] && step speculative 90 "$PY" -m llmperf.measure.speculative \
    reports/speculative/llama-style-12l-cpu.yaml --early-exit 2 --tail-scale 0.06 --device cuda --dtype bf16 \
    --backend triton -H "$R/gpu/calibrate.yaml" -k 1,4 -p 64 -g 64 --reps 5 --out "$R/speculative"
step family-tests 100 "$PY" -m pytest tests/engine/test_cuda_families.py tests/engine/test_tensor_parallel.py -k \
    'cuda or nccl' -q -p no:cacheprovider "${XDIST[@]}" "${TIMEOUT[@]}" --junitxml "$R/family-tests.xml"
# the MLA decode kernel at every batch and context (the --quick set has batch 1 only), autotuned
step kernel-bench-mla 150 "$PY" -m llmperf.measure.kernel_bench --ops mla --out "$R/kernels-mla"
if [[ -f $R/gpu/calibrate.yaml ]]; then
    for model in qwen3-30b-a3b gpt-oss-20b reports/profile/deepseek-v3-quarter-cpu.yaml; do
        name=$(basename "$model" .yaml); name=${name%-cpu}
        step "profile-$name" 75 "$PY" -m llmperf.cli profile "$model" --layers 2 --device cuda --dtype bf16 \
            --backend triton -b 1,8 -p 512 -g 16 -H "$R/gpu/calibrate.yaml" -o "$R/todays/$name"
        [[ -f $R/todays/$name/run.json ]] && step "accuracy-$name" 20 "$PY" -m llmperf.measure.accuracy \
            "$R/todays/$name" --save
    done
fi
step kernel-tests 240 "$PY" -m pytest tests/kernels -q -p no:cacheprovider "${XDIST[@]}" "${TIMEOUT[@]}" --durations 10 \
    --junitxml "$R/kernel-tests.xml"
echo "done in $SECONDS s"
pack
