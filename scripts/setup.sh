#!/usr/bin/env bash
# Installs what shardlm builds and tests with, idempotently (a second run installs nothing):
#  - Debian packages: compiler, CMake, Ninja, lld, OpenMPI, GoogleTest, JSON/CLI11, SentencePiece, Chromium;
#  - one Python virtual environment ($SHARDLM_VENV, default /opt/shardlm/venv) with the pinned
#    packages of scripts/requirements.txt: the PyPI `torch` wheel carries the PyTorch C++ library
#    (headers, libtorch, CMake config) that shardlm builds on, and transformers is the reference.
# `--peers` also installs scripts/requirements-peers.txt (DeepSpeed, for bench/peers.py).
# Prints nothing when nothing is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SHARDLM_VENV:-/opt/shardlm/venv}

PKGS=(build-essential cmake ninja-build lld pkg-config python3 python3-venv
      libopenmpi-dev openmpi-bin libgtest-dev nlohmann-json3-dev libcli11-dev
      libsentencepiece-dev sentencepiece xz-utils libpcre2-dev libutf8proc-dev zlib1g-dev
      chromium)  # headless Chromium renders `shardlm report` pages in tests/integration/test_report.py
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# pip_install NAME FILE [PIP ARGS]: installs FILE's pins unless the stamp says this exact file is installed.
pip_install() {
  local file=$2 stamp="$VENV/.shardlm-$1.sha256" want; shift 2
  want=$(sha256sum "$file" | cut -d' ' -f1)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  echo "[setup] installing Python packages from $file into $VENV (first time: several minutes, ~5 GB)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$@" -r "$file"
  echo "$want" > "$stamp"
}
if [ ! -x "$VENV/bin/python" ]; then
  $SUDO mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
fi
pip_install requirements scripts/requirements.txt
if [ "${1:-}" = "--peers" ]; then
  # DeepSpeed builds from source; it imports torch while building, hence no build isolation.
  pip_install peers scripts/requirements-peers.txt --no-build-isolation
fi
