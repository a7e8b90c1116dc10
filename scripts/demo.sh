#!/usr/bin/env bash
# The main job on a built-in default: plan -> validation suite (real Megatron-Core training) -> report + history.
#
#   1. plan     the parallel layout of Llama 3.1 70B on 64 H100s (the cost model at cluster scale), and
#               of the built-in `tiny` GPT on this machine's 2 CPU ranks;
#   2. suite    the packaged `tiny-local` suite: prepare, preflight, smoke run, checkpoint save -> resume
#               (same-step loss continuity), a 2-combo sweep with gates on tokens/s, step time, loss and the
#               loss-curve slope, every node's log scanned for error signatures — real Megatron-Core on CPU;
#   3. report   one self-contained HTML report, the run deck JSON (with its JSON Schema) and JUnit XML;
#   4. history  the run is recorded (SQLite); from the second demo on, it is compared with the last one, and
#               each combo's prediction (this machine's CPU, measured) is calibrated on the runs before it;
#               on the first demo, on this run's own smoke run and combos (shown, never gated).
set -euo pipefail
cd "$(dirname "$0")/.."
MP=.venv/bin/megapilot
DEMO_ROOT=${MEGAPILOT_DEMO_DIR:-$PWD/runs/demo}
mkdir -p "$DEMO_ROOT"
export MEGAPILOT_HISTORY=${MEGAPILOT_HISTORY:-$DEMO_ROOT/history.sqlite}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/4 plan: Llama 3.1 70B on 64 x H100 (seq 8192, GBS 1024)"
"$MP" plan --model llama3.1-70b --gpu h100 --gpus 64 --seq-len 8192 --gbs 1024 --top 3

step "1/4 plan: the built-in tiny GPT on this machine (2 ranks, seq 128, GBS 8)"
"$MP" plan --model tiny --gpu h100 --gpus 2 --seq-len 128 --gbs 8 --top 3

step "2/4 suite: the packaged tiny-local suite (smoke, checkpoint save -> resume, 2-combo sweep, gates)"
"$MP" suite init tiny-local -o "$DEMO_ROOT/tiny-local.json" --force
"$MP" suite check "$DEMO_ROOT/tiny-local.json"
previous=$("$MP" history list --limit 1 --json | .venv/bin/python -c \
  'import json,sys; runs=json.load(sys.stdin); print(runs[0]["run_id"] if runs else "")')
suite_status=0
"$MP" suite run "$DEMO_ROOT/tiny-local.json" --out "$DEMO_ROOT/runs" || suite_status=$?

read -r latest verdict run_dir < <("$MP" history list --limit 1 --json | .venv/bin/python -c \
  'import json,sys; run=json.load(sys.stdin)[0]; print(run["run_id"], run["verdict"], run["run_dir"])')

step "3/4 report: $run_dir/report.html (predicted vs measured per combo)"
.venv/bin/python - "$run_dir/suite.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
for combo in result["combos"]:
    predicted = combo.get("predicted") or {}
    measured = next((m["value"] for m in combo["metrics"] if m["name"] == "training.tokens_per_gpu"), None)
    if predicted.get("tokens_per_s_per_gpu") and measured:
        how = (f"calibrated on {len(predicted['calibration_runs'])} run(s)" if predicted.get("calibration_runs")
               else "uncalibrated")
        error = (measured - predicted["tokens_per_s_per_gpu"]) / predicted["tokens_per_s_per_gpu"] * 100
        print(f"{combo['key']}: predicted {predicted['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU ({how}), "
              f"measured {measured:,.0f} ({error:+.0f} %)")
PY
step "4/4 history: this run and the ones before it"
"$MP" history list --limit 5
"$MP" history calibration --cluster local || true
if [ -n "$previous" ]; then
  "$MP" history compare "$previous" "$latest"
else
  echo "(first demo run: run 'make demo' again to see it compared with this one)"
fi

# The run's own verdict (a WARN exits 0 too: gates passed, but it regressed against the history), with its exit code.
printf '\n\033[1mdemo: suite %s\033[0m\n' "$verdict$([ "$suite_status" -eq 0 ] || echo " (exit $suite_status)")"
printf 'report:   %s\n' "$run_dir/report.html"
printf 'run deck: %s\n' "$run_dir/megatron_run_deck.json"
printf 'junit:    %s\n' "$run_dir/junit.xml"
exit "$suite_status"
