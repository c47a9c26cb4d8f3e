#!/usr/bin/env bash
# One command for the H200 machine: builds shardlm there and checks its CUDA path, in <= 8 minutes.
#
#   bash scripts/gpu/gpu_carry.sh                 # HERE first: the .debs the GPU machine lacks -> .gpu_carry/
#   (device call) command: bash scripts/gpu/gpu_check.sh $OUT     carry: [".gpu_carry"]     timeout_s: ~560
#   bash scripts/gpu/gpu_check.sh --cpu-rehearsal [--hide-system-deps] OUT   # HERE: the same stages on CPU
#
# Writes OUT/gpu_check.json (one JSON object, rewritten after every stage, so it exists with every
# stage reached however the run ends), OUT/gpu_check.log (everything printed) and OUT/runs.tar.gz
# (metrics.jsonl, memory.json, plan.json, train_config.json and output of every training run).
# Stages (each status ok | failed | skipped, a reason, seconds and numbers):
#   0 env        nvidia-smi, torch/CUDA/NCCL versions, nproc, python, compilers
#   1 deps       dpkg -x the carried .debs into /tmp/shardlm_deps (scripts/gpu/gpu_deps.sh); a system MPI wins
#   2 build      cmake -G Ninja against the machine's torch, -DSHARDLM_BUILD_TESTS=OFF, only `shardlm`, into build-gpu/
#   3 parity     tiny model, CPU vs CUDA, fp32 and bf16: losses, grad norms, final weights
#   4 zero       ZeRO stages 0-3 on one rank, CUDA, bf16: losses vs stage 0, memory.json
#   5 speed      llama-1b (TinyLlama-1.1B shape), bf16, seq 2048, 30 steps: tokens/s, MFU, peak memory vs plan
#   6 peer       bench/gpu_peer.py: plain PyTorch loop of the same model and batch, and the bf16 GEMM peak
#   7 multirank  2 ranks on the one GPU over MPI vs 1 rank; NCCL with 2 ranks on one GPU must fail fast
#   8 moe        tiny Mixtral and Qwen2-MoE, CPU vs CUDA in fp32 and bf16 (grouped expert products); fp32 ZeRO-3 vs 0
#   9 offload    ZeRO-Offload (offload_optimizer cpu), then nvme (states in files under the work dir, streamed
#                through the host), ZeRO-3 with parameters in host memory, ZeRO-Infinity (ZeRO-3,
#                parameters and states in files), bf16 masters (alone and with parameters in host memory:
#                the host shards are the masters), demo model, bf16, 10 steps vs the same CUDA run without it:
#                losses/weights (bitwise equality recorded), step times, host/device/disk bytes = plan
# (bench/gpu_check.py runs stages 0 and 3-9 and writes the JSON; stages 3-9 run in the order
# parity, speed, peer, multirank, zero, offload, moe, each under its own time cap.)
# Environment: GPU_CHECK_BUDGET_S (whole run; default 470, rehearsal 3600), GPU_CHECK_BUILD_DIR
# (default build-gpu; rehearsal build-gpucheck), GPU_CHECK_JOBS (default nproc), GPU_CHECK_ONLY
# (comma-separated subset of the stages 3-9), GPU_CHECK_SPEED_MB (micro-batch of the speed run),
# SHARDLM_CARRIED_MPI=1 (ignore a system MPI), PYTHON (default python3; rehearsal: $SHARDLM_VENV's).
set -Eeuo pipefail

REHEARSAL=0 HIDE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-rehearsal) REHEARSAL=1; shift ;;
    --hide-system-deps) HIDE=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: $0 [--cpu-rehearsal [--hide-system-deps]] OUT_DIR" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$(mkdir -p "$1" && cd "$1" && pwd)

if [ $HIDE = 1 ] && [ "${SHARDLM_IN_HIDDEN_NS:-}" != 1 ]; then
  # Rehearse the GPU machine's situation: the packages we carry are hidden from this run.
  args=(); [ $REHEARSAL = 1 ] && args+=(--cpu-rehearsal)
  exec bash "$ROOT/scripts/gpu/gpu_hide_system_deps.sh" bash "$ROOT/scripts/gpu/gpu_check.sh" "${args[@]}" "$OUT"
fi

START=$(date +%s)
if [ $REHEARSAL = 1 ]; then BUDGET=${GPU_CHECK_BUDGET_S:-3600}; else BUDGET=${GPU_CHECK_BUDGET_S:-470}; fi
DEADLINE=$((START + BUDGET))
PY=${PYTHON:-python3}
# Here the pinned environment has torch (the first python3 on PATH may not).
[ $REHEARSAL = 1 ] && [ -z "${PYTHON:-}" ] && [ -x "${SHARDLM_VENV:-/opt/shardlm/venv}/bin/python" ] &&
  PY=${SHARDLM_VENV:-/opt/shardlm/venv}/bin/python
BUILD=${GPU_CHECK_BUILD_DIR:-$([ $REHEARSAL = 1 ] && echo build-gpucheck || echo build-gpu)}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
JOBS=${GPU_CHECK_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1  # the log shows Python's lines in order with everything else
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
cd "$ROOT"
REH=(); [ $REHEARSAL = 1 ] && REH=(--rehearsal)
left() { echo $((DEADLINE - $(date +%s))); }
gc() { "$PY" "$ROOT/bench/gpu_check.py" "$1" --work "$WORK" --out "$OUT" "${@:2}"; }
record() { # record STAGE STATUS REASON SECONDS [DATA_JSON]
  local data=${5:-}; [ -n "$data" ] || data='{}'
  gc record --stage "$1" --status "$2" --reason "$3" --seconds "$4" --data "$data" || true
}
jobj() { # jobj KEY=VALUE...: a JSON object; values that parse as JSON stay numbers/booleans, others are strings
  "$PY" -c 'import json, sys
d = {}
for a in sys.argv[1:]:
    k, _, v = a.partition("=")
    try:
        d[k] = json.loads(v)
    except ValueError:
        d[k] = v
print(json.dumps(d))' "$@"
}
finish() {
  local rc=$?
  trap - EXIT
  gc finalize || echo "gpu_check: finalize failed (exit $?); $OUT/gpu_check.json holds the stages recorded so far"
  echo "gpu_check: done in $(($(date +%s) - START)) s (budget $BUDGET s); log $LOG"
  exec 1>&- 2>&-  # let tee write the last lines of the log before the command returns
  wait "$TEE_PID" 2>/dev/null || true
  exit $rc
}
trap finish EXIT

echo "gpu_check: $(date -Is) mode=$([ $REHEARSAL = 1 ] && echo cpu-rehearsal || echo gpu) budget=${BUDGET}s out=$OUT work=$WORK build=$BUILD"
command -v "$PY" >/dev/null || { echo "gpu_check: no $PY"; exit 1; }

# ---- 0. environment --------------------------------------------------------------------------
echo "== stage env"
timeout 120 "$PY" "$ROOT/bench/gpu_check.py" env --work "$WORK" --out "$OUT" --started "$START" --budget "$BUDGET" "${REH[@]}" ||
  record env failed "environment probe failed or timed out" 0

# ---- 1. dependencies -------------------------------------------------------------------------
echo "== stage deps"
t0=$(date +%s)
export GPU_CHECK_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}  # the peer runs without the carried libraries
# shellcheck source=gpu_deps.sh
source "$ROOT/scripts/gpu/gpu_deps.sh"
# (In a rehearsal here without --hide-system-deps, Debian's own OpenMPI is the "system MPI";
# SHARDLM_CARRIED_MPI=1 takes the carried one instead.)
deps_ok=0; gpu_deps_setup "$ROOT/.gpu_carry/debs" && deps_ok=1
deps_json=$(jobj mpi="$DEPS_MPI" debs="${DEPS_DEBS:-0}" dir="$DEPS_DIR" missing_libs="$DEPS_MISSING_LIBS" \
  mpirun="$(command -v mpirun || true)" pkg_config="$(command -v pkg-config || true)" opal_prefix="${OPAL_PREFIX:-}")
if [ $deps_ok = 1 ]; then
  mpirun --version 2>&1 | head -2 || true
  record deps ok "" $(($(date +%s) - t0)) "$deps_json"
else
  record deps failed "$DEPS_REASON" $(($(date +%s) - t0)) "$deps_json"
fi

# ---- 2. build --------------------------------------------------------------------------------
echo "== stage build"
t0=$(date +%s)
build_ok=0 reason=""
TORCH_ROOT=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
CMAKE=cmake NINJA=ninja
command -v cmake >/dev/null || CMAKE=$("$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null || echo cmake)
command -v ninja >/dev/null || NINJA=$("$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || echo ninja)
if [ -z "$TORCH_ROOT" ]; then
  reason="$PY cannot import torch"
elif ! command -v "$CMAKE" >/dev/null; then
  reason="no cmake"
else
  gen=(-G Ninja -DCMAKE_MAKE_PROGRAM="$(command -v "$NINJA" || echo ninja)")
  command -v "$NINJA" >/dev/null || gen=(-G "Unix Makefiles")
  cmake_args=(-S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLM_BUILD_TESTS=OFF
              -DSHARDLM_PYTHON="$(command -v "$PY")"
              -DCMAKE_PREFIX_PATH="$TORCH_ROOT;$TORCH_ROOT/share/cmake;${DEPS_DIR:-/tmp/shardlm_deps}/usr")
  if [ $REHEARSAL = 0 ]; then
    # H200 = sm_90. Torch's CMake config reads this (not CMAKE_CUDA_ARCHITECTURES); it matters only
    # if shardlm compiles CUDA code, and it spares the configure step the GPU probe.
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    [ -d /usr/local/cuda ] && { export PATH="$PATH:/usr/local/cuda/bin"; cmake_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda); }
  fi
  budget_build=$(( $(left) - 150 ))  # leave the stages at least 150 s
  cap=330; [ $REHEARSAL = 1 ] && cap=3000  # 2 cores here: ~10 minutes from scratch
  [ $budget_build -gt $cap ] && budget_build=$cap
  if [ $budget_build -lt 60 ]; then
    reason="time budget: $(left) s left"
  else
    # A build directory configured against another MPI (system vs carried) keeps the old paths in
    # its cache: start its configuration over.
    if [ -f "$BUILD/CMakeCache.txt" ] && [ "$(cat "$BUILD/.gpu_check_mpi" 2>/dev/null)" != "$DEPS_MPI" ]; then
      rm -f "$BUILD/CMakeCache.txt"
    fi
    mkdir -p "$BUILD" && echo "$DEPS_MPI" >"$BUILD/.gpu_check_mpi"
    tc=$(date +%s)
    if timeout 120 "$CMAKE" "${cmake_args[@]}" 2>&1 | tail -40; then
      configure_s=$(($(date +%s) - tc)); tb=$(date +%s)
      if [ "${gen[1]}" = Ninja ]; then bcmd=("$NINJA" -C "$BUILD" -j"$JOBS" shardlm); else bcmd=(make -C "$BUILD" -j"$JOBS" shardlm); fi
      brc=0
      timeout $((budget_build - configure_s)) "${bcmd[@]}" >"$WORK/build.log" 2>&1 || brc=$?
      { grep -v '^\[[0-9]*/[0-9]*\] ' "$WORK/build.log" || true; } | tail -60
      if [ $brc = 0 ]; then
        build_ok=1
      elif [ $brc = 124 ]; then
        reason="build timed out after $(($(date +%s) - tb)) s (limit $((budget_build - configure_s)) s)"
      else
        reason="build failed (exit $brc) after $(($(date +%s) - tb)) s: $( { grep -m1 -E 'error|Error' "$WORK/build.log" || true; } | cut -c1-300)"
      fi
      build_s=$(($(date +%s) - tb))
    else
      reason="cmake configure failed (see the log)"
    fi
  fi
fi
if [ $build_ok = 1 ] && [ -x "$BUILD/shardlm" ]; then
  version=$(timeout 60 "$BUILD/shardlm" --version 2>&1 | tr '\n' ' ' || true)
  record build ok "" $(($(date +%s) - t0)) "$(jobj dir="$BUILD" configure_s="${configure_s:-0}" compile_s="${build_s:-0}" \
    jobs="$JOBS" binary_bytes="$(stat -c %s "$BUILD/shardlm")" version="$version")"
else
  build_ok=0
  record build failed "${reason:-no binary}" $(($(date +%s) - t0)) "$(jobj dir="$BUILD" jobs="$JOBS")"
fi

# ---- 3-9. parity, speed, peer, multirank, zero, offload, moe ----------------------------------------
echo "== stages parity, speed, peer, multirank, zero, offload, moe ($(left) s left)"
stage_args=(--deadline "$DEADLINE" "${REH[@]}")
[ -n "${GPU_CHECK_ONLY:-}" ] && stage_args+=(--only "$GPU_CHECK_ONLY")
# The driver keeps to DEADLINE itself; the outer timeout (15 s later) only catches a hang in it.
if [ $build_ok = 1 ]; then
  timeout $(( $(left) + 15 )) "$PY" "$ROOT/bench/gpu_check.py" stages --work "$WORK" --out "$OUT" \
    --shardlm "$BUILD/shardlm" "${stage_args[@]}" || echo "gpu_check: stages ended with exit $?"
else
  for s in parity zero speed multirank offload; do record $s skipped "no shardlm binary (build stage failed)" 0; done
  # The peer needs no shardlm: still measure PyTorch and the GEMM peak.
  timeout $(( $(left) + 15 )) "$PY" "$ROOT/bench/gpu_check.py" stages --work "$WORK" --out "$OUT" \
    "${stage_args[@]}" --only peer || true
fi
exit 0
