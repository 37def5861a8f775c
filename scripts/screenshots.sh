#!/usr/bin/env bash
# The report pages as a new user sees them, at 1280 px: regenerates docs/screenshots/*.png.
#
#   bash scripts/screenshots.sh            # after scripts/setup.sh; about a minute
#
# tiny_gpt (the README's first command), llama-2-7b at 1024 tokens (its first screen and its
# graph overview, the SVG the page embeds) and llama-3-70b planned over 64 H100s (the plan's first screen). Each page
# is written by analyze into a temporary folder and shot by Debian's headless chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
A=.venv/bin/analyze
[ -x "$A" ] || { echo "no $A: run scripts/setup.sh first" >&2; exit 2; }
command -v chromium >/dev/null || { echo "no chromium: run scripts/setup.sh first" >&2; exit 2; }
OUT=docs/screenshots
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

page() {  # name, then the analyze arguments
  local name=$1; shift
  "$A" "$@" --quiet --out "$WORK/$name"
}

shot() {  # png name, page folder, file in it, height
  timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size="1280,$4" --screenshot="$OUT/$1.png" \
    "file://$(realpath "$WORK/$2")/$3" >/dev/null 2>&1
  [ -s "$OUT/$1.png" ] || { echo "no screenshot of $2/$3" >&2; exit 1; }
  echo "wrote $OUT/$1.png"
}

page tiny_gpt examples/tiny_gpt.py --device h100
page llama-2-7b hf:llama-2-7b --seq-len 1024 --device h100
page plan-70b hf:llama-3-70b --seq-len 4096 --train --plan --gpus 64 --device h100 \
  --tokens 1e12 --price 2.5
shot tiny_gpt tiny_gpt report.html 1600
shot llama-2-7b llama-2-7b report.html 1600
shot llama-2-7b-graph llama-2-7b graph.svg 1600    # the overview the page's Graph section holds
shot plan-70b plan-70b report.html 1600
