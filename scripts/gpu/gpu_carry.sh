#!/usr/bin/env bash
# Run HERE (the Debian 12 development machine), before a device call of scripts/gpu/gpu_check.sh:
# downloads the Debian .debs that the GPU machine needs to build and run shardlm and that it lacks
# (it has no package registry): OpenMPI (runtime, headers, mpirun/orted) with its non-base runtime
# libraries, nlohmann-json, CLI11, SentencePiece, and pkgconf in case it has no pkg-config.
# They go to .gpu_carry/debs/ (ignored through .git/info/exclude, not .gitignore); the device call
# names ".gpu_carry" in `carry`, and gpu_check.sh unpacks them with `dpkg -x` into /tmp/shardlm_deps.
# Idempotent: a .deb already there is not fetched again; stale versions are removed.
# Prints the total size (carry + working tree must stay under the device tool's 64 MiB).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
DEST=.gpu_carry/debs

# Runtime closure of libopenmpi3/openmpi-bin without what every glibc system has (libc6, libstdc++6,
# libgcc-s1, zlib1g, libudev1, libatomic1, libuuid1) and without optional plugins with large
# closures (libhwloc-plugins: X11/OpenCL/libxml2; ibverbs-providers: no InfiniBand in a VM), and
# without what only the Fortran bindings load (libgfortran5; objdump -p of every carried library
# and component: nothing else needs it, nor libltdl7 or libpciaccess0).
# gpu_check.sh's dependency stage lists any shared library still missing (ldd) in its log and JSON.
# libgtest-dev's dependency `googletest` (sources) is not needed: its CMake config and static
# libraries are in libgtest-dev itself.
PKGS=(
  libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libpsm2-2 libpsm-infinipath1 libmunge2 libnuma1
  nlohmann-json3-dev libcli11-dev libsentencepiece-dev libsentencepiece0
  pkgconf pkgconf-bin libpkgconf3
  libgtest-dev  # only so that a CMakeLists without SHARDLM_BUILD_TESTS=OFF still configures (240 KB)
)

exclude=.git/info/exclude
mkdir -p "$(dirname "$exclude")" "$DEST"
grep -qxF '/.gpu_carry/' "$exclude" 2>/dev/null || echo '/.gpu_carry/' >>"$exclude"

# The exact file names apt would download (package_version_arch.deb, ':' escaped as %3a).
want=()
for p in "${PKGS[@]}"; do
  line=$(apt-cache show --no-all-versions "$p" 2>/dev/null | grep -m1 '^Filename:' || true)
  [ -n "$line" ] || { echo "gpu_carry: apt knows no package $p (run apt-get update?)" >&2; exit 1; }
  want+=("$(basename "${line#Filename: }")")
done
missing=()
for i in "${!PKGS[@]}"; do
  [ -s "$DEST/${want[$i]}" ] || missing+=("${PKGS[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu_carry: downloading ${missing[*]}"
  (cd "$DEST" && apt-get download -q "${missing[@]}" >/dev/null)
fi
# Remove anything that is not one of the wanted files (older versions, packages dropped from PKGS).
for f in "$DEST"/*.deb; do
  keep=0
  for w in "${want[@]}"; do [ "$(basename "$f")" = "$w" ] && keep=1; done
  [ $keep = 1 ] || { echo "gpu_carry: removing stale $(basename "$f")"; rm -f "$f"; }
done
for w in "${want[@]}"; do [ -s "$DEST/$w" ] || { echo "gpu_carry: $w did not download" >&2; exit 1; }; done

carry_kib=$(du -sk .gpu_carry | cut -f1)
# What travels besides the carry: tracked files plus untracked files git does not ignore.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
             awk '{s+=$1} END {print s+0}')
total_mib=$(awk -v c="$carry_kib" -v t="$tree_bytes" 'BEGIN {printf "%.1f", (c*1024 + t) / 1048576}')
printf 'gpu_carry: %d .debs, %.1f MiB in .gpu_carry; working tree %.1f MiB; together %s MiB (limit 64 MiB)\n' \
  "${#want[@]}" "$(awk -v c="$carry_kib" 'BEGIN {print c/1024}')" "$(awk -v t="$tree_bytes" 'BEGIN {print t/1048576}')" \
  "$total_mib"
awk -v m="$total_mib" 'BEGIN {exit !(m > 50)}' && { echo "gpu_carry: over 50 MiB: trim PKGS or the tree" >&2; exit 1; }
exit 0
