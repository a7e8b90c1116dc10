#!/usr/bin/env bash
# The main job on a built-in default: plan -> launch script -> real Megatron-Core training -> log check.
#
#   1. plan     the parallel layout of Llama 3.1 70B on 64 H100s (the cost model at cluster scale), and of
#               the built-in `tiny` GPT on 2 ranks, saved as plan.json;
#   2. data     tokenize the shipped public-domain corpus into Megatron's indexed format;
#   3. script   render plan.json into a checked torchrun script for the embedded Megatron-Core trainer
#               (CPU: gloo, fp32; on a GPU machine the same script shape runs Megatron-LM with NCCL);
#   4. run      train it for real (Megatron-Core, distributed optimizer, checkpoint at the end);
#   5. validate parse the training log (steady-state step time, loss) and diagnose it; the verdict and
#               every artefact land in the run directory printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
MP=.venv/bin/megapilot
RUN_ROOT=${MEGAPILOT_DEMO_DIR:-$PWD/runs/demo-$(date +%Y%m%d-%H%M%S)}
ITERS=${MEGAPILOT_DEMO_ITERS:-40}
mkdir -p "$RUN_ROOT/data"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/5 plan: Llama 3.1 70B on 64 x H100 (seq 8192, GBS 1024)"
"$MP" plan --model llama3.1-70b --gpu h100 --gpus 64 --seq-len 8192 --gbs 1024 --top 3

step "1/5 plan: the built-in tiny GPT on 2 ranks (seq 128, GBS 16) -> plan.json"
"$MP" plan --model tiny --gpu h100 --gpus 2 --seq-len 128 --gbs 16 --top 3 --save "$RUN_ROOT/plan.json"

step "2/5 data: shipped corpus -> Megatron indexed dataset"
"$MP" data prepare megapilot/trainer/data/corpus/kjv_pentateuch.txt.gz --output-prefix "$RUN_ROOT/data/corpus"

step "3/5 script: plan.json -> torchrun script for the embedded Megatron-Core trainer"
"$MP" script --plan "$RUN_ROOT/plan.json" --cpu --entrypoint megapilot --data-path "$RUN_ROOT/data/corpus" \
  --tokenizer-type NullTokenizer --save "$RUN_ROOT/checkpoints" --train-iters "$ITERS" -o "$RUN_ROOT/train.sh"

step "4/5 run: real training (Megatron-Core on CPU)"
run_status=0
"$MP" run "$RUN_ROOT/train.sh" --run-dir "$RUN_ROOT/runs" --combo tiny || run_status=$?

LOG="$RUN_ROOT/runs/tiny/out-node0/training.log"
step "5/5 validate: parse the log and diagnose it"
# the trainer prints Megatron-LM's arguments block: the parser takes seq length, GBS and world size
# from it to turn step times into tokens/s/GPU
"$MP" logs parse "$LOG"
"$MP" logs parse "$LOG" --json > "$RUN_ROOT/log.json"
"$MP" diagnose "$LOG" --script "$RUN_ROOT/train.sh" --gpu h100
"$MP" diagnose "$LOG" --script "$RUN_ROOT/train.sh" --gpu h100 --json > "$RUN_ROOT/diagnosis.json"

state=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"]["state"])' \
  "$RUN_ROOT/runs/tiny/job.json")
printf '\n\033[1mdemo: training %s — artefacts in %s\033[0m\n' "$state" "$RUN_ROOT"
exit "$run_status"
