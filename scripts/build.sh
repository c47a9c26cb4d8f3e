#!/usr/bin/env bash
# Configures and builds shardlm into build/ (the CLI is build/shardlm). Installs missing packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" "$@"
