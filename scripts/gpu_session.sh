#!/usr/bin/env bash
# Every GPU check in one prepared run, for a lent GPU machine (minutes of device time, once):
#
#   1. scripts/gpu_check.py          a real probe report; NCCL loads the topology XML fstrain writes;
#                                    the bench compute suite (bf16 matmul TFLOPS, HBM bandwidth) and
#                                    NCCL all_reduce bus bandwidth over the machine's GPUs
#   2. scripts/gpu_train_check.py    --matrix timeterms: runs that separate the step-time terms:
#                                    `fstrain bench --suite compute --model M --micro-batch B` (the
#                                    GEMMs of gpt2-1.5b and tiny at micro-batch 1 and 8, of the
#                                    sliced Llama of the calibration runs, and the default grid),
#                                    then FSDP2 training runs of tiny and gpt2-1.5b at micro-batch 1
#                                    and 8, as the budget allows (timeterms-summary.json: every bench
#                                    document and run)
#   3. scripts/gpu_train_check.py    --matrix speed: FSDP2 and the rendered ZeRO-2 and ZeRO-3 files
#                                    on gpt2-1.5b with the same batch; fails unless each DeepSpeed
#                                    run reaches 80 % of FSDP2's tokens/s (the verdict is in
#                                    session.log and speed/summary.md in the archive)
#   4. scripts/gpu_train_check.py    --matrix calibration: the bundled trainer's measured peak memory
#                                    and tokens/s for several models, layouts and activation-
#                                    checkpointing policies, beside the plan's prediction (off by
#                                    default: its first cases were captured on 2026-11-30, see
#                                    tests/fixtures/gpu/h200-2026-11-30; FSTRAIN_GPU_TRAIN_S=240 runs it)
#
# Run from the repository root:  scripts/gpu_session.sh OUT_DIR   (default $OUT)
# With the device tool: run(command='scripts/gpu_session.sh "$OUT"', carry=['.whl'], timeout_s=600)
# (the stages' limits add up to 580 s: check 120, timeterms 240, speed 220, train 0;
# FSTRAIN_GPU_TIMETERMS_S, FSTRAIN_GPU_SPEED_S and FSTRAIN_GPU_TRAIN_S change the last three, 0 skips a
# stage).
# Wheels in .whl/ (deepspeed and what it needs that the machine lacks; see docs/benchmarks.md) are
# installed into /tmp/site first. Each stage has its own time limit, so a stage that hangs costs
# only its own share; the stages' files are packed at the end into at most 8 files in OUT_DIR
# (the device tool brings back 8): check-summary.json, timeterms-summary.json, train-summary.json,
# train-summary.md, bench-compute.json, bench-collectives.json, session.log, gpu-session.tar.gz
# (everything, logs and the probe report included).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-gpu-session-out}}")
work=$(mktemp -d /tmp/fstrain-gpu-session.XXXXXX)
mkdir -p "$out" "$work/check" "$work/timeterms" "$work/speed" "$work/train"
log="$out/session.log"
: >"$log"
say() { echo "[gpu_session $(date +%H:%M:%S)] $*" | tee -a "$log" >&2; }

if compgen -G ".whl/*.whl" >/dev/null; then
    say "installing $(ls .whl | wc -l) carried wheels into /tmp/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >>"$log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1

stage() {  # name seconds argv...
    local name=$1 seconds=$2
    shift 2
    if [ "$seconds" -le 0 ]; then say "stage $name: skipped"; return; fi
    say "stage $name (limit ${seconds}s): $*"
    timeout --kill-after=10 "$seconds" "$@" >"$work/$name.log" 2>&1
    local code=$?
    say "stage $name: exit $code"
    tail -n 40 "$work/$name.log" >>"$log"
}

stage check 120 python3 scripts/gpu_check.py "$work/check"
timeterms_s=${FSTRAIN_GPU_TIMETERMS_S:-240}
stage timeterms "$timeterms_s" python3 scripts/gpu_train_check.py "$work/timeterms" --matrix timeterms --steps 5 \
    --budget-s "$(( timeterms_s - 25 ))"
speed_s=${FSTRAIN_GPU_SPEED_S:-220}
stage speed "$speed_s" python3 scripts/gpu_train_check.py "$work/speed" --matrix speed --steps 4 \
    --budget-s "$(( speed_s - 25 ))"
train_s=${FSTRAIN_GPU_TRAIN_S:-0}
# FSTRAIN_GPU_CASES=name,name runs only those calibration cases (names as gpu_train_check.py's table prints them).
stage train "$train_s" python3 scripts/gpu_train_check.py "$work/train" --matrix calibration \
    --steps 4 --budget-s "$(( train_s - 25 ))" ${FSTRAIN_GPU_CASES:+--only "$FSTRAIN_GPU_CASES"}

cp "$work/check/summary.json" "$out/check-summary.json" 2>/dev/null
cp "$work/timeterms/summary.json" "$out/timeterms-summary.json" 2>/dev/null
cp "$work/train/summary.json" "$out/train-summary.json" 2>/dev/null
cp "$work/train/summary.md" "$out/train-summary.md" 2>/dev/null
cp "$work/check/bench-compute.json" "$work/check/bench-collectives.json" "$out/" 2>/dev/null
tar -czf "$out/gpu-session.tar.gz" -C "$work" . 2>>"$log"
say "done: $(ls "$out" | tr '\n' ' ')"
rm -rf "$work"
