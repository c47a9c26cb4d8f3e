#!/usr/bin/env bash
# Installs the Debian packages shardlm builds and tests with. Idempotent: installs only what is missing.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libtorch-dev libopenblas-dev libopenblas0
      libopenmpi-dev openmpi-bin libgtest-dev nlohmann-json3-dev libcli11-dev
      libsentencepiece-dev sentencepiece python3-torch python3-numpy xz-utils
      chromium)  # headless Chromium renders `shardlm report` pages in tests/integration/test_report.py
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
