#!/usr/bin/env bash
# Regenerates the README's pictures (docs/*.png) by the very commands its "plan show" section
# states, so that they cannot drift from the code: the quick-start plan (GPT-3 175B on 1,024
# A100), its timeline zoomed to micro-batches 0-3 on pipeline ranks 0-1, Llama 3 8B on 16
# A100 (tp 2, pp 4), and the `plan size` front of Llama 3 70B on 15T tokens. tests/unit/pictures/test_picture_layout.py runs this into a temporary directory and
# compares the result with the shipped pictures.
# Usage: docs/make_pictures.sh [OUT_DIR]   (default: this docs/ directory; `plan` on PATH)
set -euo pipefail
out="$(cd "${1:-$(dirname "$0")}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

plan solve --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch 1536 --seq-len 2048 -o plan.json >/dev/null
plan show plan.json --timeline "$out/quick-start-timeline.png" --memory "$out/quick-start-memory.png" >/dev/null
plan show plan.json --timeline "$out/quick-start-timeline-zoom.png" --micro-batches 0-3 --ranks 0-1 >/dev/null

plan estimate --model llama3-8b --cluster dgx-a100-80gb --gpus 16 --global-batch 32 --seq-len 2048 \
    --tp 2 --pp 4 --recompute selective -o plan.json >/dev/null
plan show plan.json --placement "$out/llama3-8b-16gpu-placement.png" --timeline "$out/llama3-8b-16gpu-timeline.png" >/dev/null

plan size --model llama3-70b --clusters dgx-h100-80gb,dgx-h200,dgx-b200,gb200-nvl72,mi300x --gpus 256..8192 \
    --tokens 15T --global-batch 1024 --seq-len 8192 --min-scaling 0.9 --picture "$out/size-llama3-70b-15t.png" >/dev/null 2>&1
