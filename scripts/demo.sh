#!/usr/bin/env bash
# The main job: installs what is missing, builds, trains the default (demo) model on the bundled
# Brown corpus with 2 processes, then samples text from the trained model.
# Extra arguments go to `shardlm train`, e.g. scripts/demo.sh --steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target shardlm  # the CLI only; scripts/test.sh builds the test programs
# --resume=false: the demo trains from scratch each time (by default a run continues its out_dir's checkpoint)
build/shardlm train --config configs/demo.json --nproc 2 --resume=false "$@"
out_dir=$(sed -n 's/.*"out_dir": *"\([^"]*\)".*/\1/p' configs/demo.json)
for a in "$@"; do case "$a" in --out_dir=*) out_dir="${a#--out_dir=}";; esac; done
echo
echo "== sample from $out_dir =="
build/shardlm generate --model "$out_dir" --prompt "The jury said" --max-new-tokens 40 --seed 1
