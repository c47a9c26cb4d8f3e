#!/usr/bin/env bash
# Configures and builds shardlm into build/ (the CLI is build/shardlm) against the PyTorch C++
# library of the pinned torch wheel in $SHARDLM_VENV. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${SHARDLM_VENV:-/opt/shardlm/venv}
# The torch package root goes first: TorchConfig's find_library calls search the prefix path before
# system paths, so a system libtorch (Debian's libtorch-dev) cannot be linked in by mistake.
TORCH_ROOT=$("$VENV/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
# A new build directory uses Ninja (scripts/setup.sh installs it): it schedules every compile of every
# target as soon as its inputs exist, without make's recursive passes; one configured before keeps its
# generator (CMake refuses to switch).
GENERATOR=()
[ -f build/CMakeCache.txt ] || GENERATOR=(-G Ninja)
cmake -S . -B build "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLM_PYTHON="$VENV/bin/python" \
      -DCMAKE_PREFIX_PATH="$TORCH_ROOT;$TORCH_ROOT/share/cmake" >/dev/null
cmake --build build -j"$(nproc)" "$@"
