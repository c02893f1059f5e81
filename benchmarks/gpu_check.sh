#!/usr/bin/env bash
# The GPU path end to end on one NVIDIA GPU, in under 8 minutes:
#   1. `plan profile` of the GPU (a small GPT's layers, the GEMM sweep, the kernel tables);
#   2. `plan run` of a small plan on it (predicted against measured step time and memory);
#   3. `plan tune` of the same model, 6 trials (each a `plan run` on the GPU);
# then a markdown table of the figures a README table needs.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]        # default ./gpu-check-out
#
# Every output (profile, plan, run report, tune journal and result, logs, summary.md) goes
# under OUT_DIR. Each step has its own timeout and all of them together at most TOTAL_S; a step
# that fails or times out is reported in the table and the next one still runs; the exit code
# is 1 when any failed. Needs `plan` (pip install -e .[torch]) and torch with CUDA.
#
# The model is a 4-layer, 256-wide GPT (vocabulary 4,096): `plan run` checks every step against
# one CPU process in float64 and fp32, which for a larger model would take most of the budget.
# A GPU step of it is milliseconds (kernel launches dominate): what is checked is the path
# (NCCL launch, CUDA memory, the kernel tables, the tune's refit), not the throughput.
#
# GPU_CHECK_ON_CPU=1 runs the same commands on CPU ranks (gloo) without nvidia-smi: a check of
# the script itself on a machine without a GPU.
set -euo pipefail

OUT=${1:-./gpu-check-out}
TOTAL_S=470 # the whole check stops starting work after this (8 minutes, less the summary)
ON_CPU=${GPU_CHECK_ON_CPU:-0}

if [[ "$ON_CPU" != 1 ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no nvidia-smi on PATH: this check needs a machine with an NVIDIA GPU and its driver" >&2
    exit 2
fi
if ! command -v plan >/dev/null 2>&1; then
    echo "gpu_check: no \`plan\` on PATH: install the planner first (pip install -e '.[torch]')" >&2
    exit 2
fi
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import planner" 2>/dev/null; then
    echo "gpu_check: $PYTHON cannot import planner: set PYTHON to the interpreter \`plan\` runs on" >&2
    exit 2
fi

mkdir -p "$OUT"
if [[ "$ON_CPU" == 1 ]]; then
    BACKEND=gloo
    DEVICE="CPU ($(nproc) cores, GPU_CHECK_ON_CPU=1)"
else
    BACKEND=nccl
    DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
fi
# The shipped preset of this GPU (dgx-h100-80gb for an H100, ...): the plan's and the tune's prior.
PRESET=$("$PYTHON" -c "import sys; from planner.profiler.profile import known_preset; print(known_preset(sys.argv[1]) or '')" "$DEVICE")
PRESET=${PRESET:-dgx-h100-80gb}

MODEL="$OUT/gpu-check-gpt.json"
cat >"$MODEL" <<'EOF'
{
  "name": "gpu-check-gpt",
  "num_layers": 4,
  "hidden_size": 256,
  "num_heads": 4,
  "vocab_size": 4096,
  "max_seq_len": 256,
  "dropout": false,
  "source": "benchmarks/gpu_check.sh: a GPT small enough for plan run's single-process check"
}
EOF

echo "gpu_check: $DEVICE; preset $PRESET; outputs in $OUT" >&2
START=$SECONDS
FAILED=()

# step NAME LIMIT_S SHOW COMMAND...: run it with a timeout (its own limit, or what is left of
# TOTAL_S), stdout to OUT/NAME.out (and the terminal when SHOW is "show"), stderr to the terminal
# and OUT/NAME.log; a failure is recorded, not fatal.
step() {
    local name=$1 limit=$2 show=$3
    shift 3
    local left=$((TOTAL_S - (SECONDS - START)))
    if ((limit > left)); then
        limit=$left
    fi
    if ((limit < 10)); then
        echo "gpu_check: $name: skipped, the check's $TOTAL_S s are spent" >&2
        FAILED+=("$name (skipped)")
        return 0
    fi
    echo "gpu_check: $name (at most $limit s): $*" >&2
    local status=0
    if [[ "$show" == show ]]; then
        timeout --kill-after=30 "$limit" "$@" > >(tee "$OUT/$name.out") 2> >(tee "$OUT/$name.log" >&2) || status=$?
    else
        timeout --kill-after=30 "$limit" "$@" >"$OUT/$name.out" 2> >(tee "$OUT/$name.log" >&2) || status=$?
    fi
    if ((status == 124)); then
        FAILED+=("$name (timed out after $limit s)")
    elif ((status != 0)); then
        FAILED+=("$name (exit $status)")
    fi
    return 0
}

step profile 180 show \
    plan profile --model "$MODEL" --seq-len 256 --nproc-per-node 1 --backend "$BACKEND" --quick \
    --name gpu-check -o "$OUT/profile.json"

step estimate 60 show \
    plan estimate --model "$MODEL" --cluster "$PRESET" --gpus 1 --global-batch 8 --seq-len 256 --precision fp32 \
    --micro-batch-size 2 -o "$OUT/plan.json"

step run 150 show \
    plan run "$OUT/plan.json" --steps 6 --warmup 2 --backend "$BACKEND" --timeout 60 -o "$OUT/run.json"

step tune 300 file \
    plan tune --model "$MODEL" --cluster "$PRESET" --gpus 1 --global-batch 8 --seq-len 128 --precision fp32 \
    --trials 6 --time-budget 200 --steps 5 --warmup 2 --trial-timeout 90 --launcher local \
    --journal "$OUT/tune.jsonl" --json -o "$OUT/tuned.json" --plan-out "$OUT/tune-plan.json"

# The figures, predicted against measured, as one markdown table (also OUT/summary.md).
"$PYTHON" - "$OUT" "$DEVICE" "$PRESET" "$((SECONDS - START))" "${FAILED[@]+"${FAILED[@]}"}" <<'EOF' | tee "$OUT/summary.md"
import json
import sys
from pathlib import Path

out, device, preset, elapsed, failed = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]


def load(name):
    path = out / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ms(s):
    return "n/a" if s is None else f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def total(memory):
    """MemoryBytes' total: what `plan run` counts (planner/specs/run_report.py)."""
    return sum(memory[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes"))


def ratio(predicted, measured):
    return f" ({predicted / measured:.2f}x)" if predicted and measured else ""


rows = [("device", device), ("preset (prior)", preset)]
profile = load("profile.json")
if profile:
    from hardware_profiles import load_cluster

    dev = profile["device"]
    peak = max(dev["peak_tflops"].values())
    best = peak * max(p["efficiency"] for p in dev["matmul_efficiency"])
    pre = load_cluster(preset).device
    pre_ceiling = pre.peak_tflops["bf16"] * (pre.gemm.max_efficiency if pre.gemm else 1.0)
    rows.append(
        (
            "profile: matmul TFLOP/s, best measured vs preset",
            f"{best:.1f} vs {pre_ceiling:.1f} ({', '.join(dev['peak_tflops'])}; preset: bf16 peak "
            f"{pre.peak_tflops['bf16']:g} x GEMM ceiling {pre.gemm.max_efficiency if pre.gemm else 1:g})",
        )
    )
else:
    rows.append(("profile", "no profile"))
run = load("run.json")
if run:
    t, counted = run["time"], run["pipeline_ranks"][0]
    peak = max(r["peak_memory_bytes"] for r in run["ranks"])
    rows += [
        (
            f"run: step time, predicted ({preset}) vs measured (median of {t['measured_steps']})",
            f"{ms(t['predicted_step_time_s'])} vs {ms(t['measured_step_time_s'])}"
            f"{ratio(t['predicted_step_time_s'], t['measured_step_time_s'])}",
        ),
        (
            "run: memory counted (weights, gradients, optimizer, activations), predicted vs measured",
            f"{mib(total(counted['predicted']))} vs {mib(total(counted['measured']))} ({counted['error_pct']:+.1f} %)",
        ),
        (
            "run: peak memory, predicted (with temporaries and framework) vs measured",
            f"{mib(run['estimate']['peak_memory_gib'] * 2**30)} vs {mib(peak)} ({run['ranks'][0]['memory_method'].split(':')[0]})",
        ),
        ("run: verification", f"{run['verdict']}: {run['verification']['message']}"),
    ]
else:
    rows.append(("run", "no report"))
tune = load("tune.out")  # its --json
if tune:
    trials = tune.get("trials", [])
    ran = [t for t in trials if t.get("status") == "ok"]
    distinct = len({t["label"] for t in trials})
    best, noise, tied = tune.get("best") or {}, tune.get("noise") or {}, tune.get("tied") or []
    margin, layouts = tune.get("margin"), tune.get("exhaustive_trials")
    if distinct == layouts:
        bound = "none: every layout was measured"
    else:
        bound = "n/a" if margin is None else f"{100 * max(0.0, margin):.1f} %"
    rows += [
        ("tune: trials (ran to the end; layouts) of the layouts", f"{len(trials)} ({len(ran)}; {distinct}) of {layouts}"),
        ("tune: best measured", f"{best.get('label', 'none')}, {ms(best.get('step_time_s'))}"),
        ("tune: tied within noise (the answer)", ", ".join(t["label"] for t in tied) or "none"),
        ("tune: noise between two measurements of a layout", f"{noise['level'] * 100:.1f} %" if "level" in noise else "n/a"),
        ("tune: regret bound (an untried layout could be faster by)", bound),
        ("tune: stop reason", str(tune.get("stop", "n/a"))),
    ]
    for t in ran:
        before, after = t.get("predicted_before_s"), t.get("predicted_after_s")
        rows.append(
            (
                f"tune: trial {t['index'] + 1} {t['label']}",
                f"predicted {ms(before)} before, {ms(after)} after refit; measured {ms(t.get('step_time_s'))}",
            )
        )
else:
    rows.append(("tune", "no result"))
rows.append(("check", f"{elapsed} s; " + ("failed: " + "; ".join(failed) if failed else "every step ran")))
print("| figure | value |")
print("|---|---|")
for name, value in rows:
    print(f"| {name} | {value.replace('|', '/')} |")
EOF

((${#FAILED[@]} == 0)) || exit 1
