#!/usr/bin/env bash
# Configures and builds shardlm into build/ (the CLI is build/shardlm) against the PyTorch C++
# library of the pinned torch wheel in $SHARDLM_VENV. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${SHARDLM_VENV:-/opt/shardlm/venv}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLM_PYTHON="$VENV/bin/python" \
      -DCMAKE_PREFIX_PATH="$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')" >/dev/null
cmake --build build -j"$(nproc)" "$@"
