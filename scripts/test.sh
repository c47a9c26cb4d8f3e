#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every ctest (unit, golden parity,
# multi-rank under mpirun, command-line behaviour). Tests run side by side on every core where that is
# safe: tests/tests.cmake says which run alone and which take two slots.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build
ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"
