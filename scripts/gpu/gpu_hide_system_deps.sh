#!/usr/bin/env bash
# Rehearsal helper, HERE only (root, Debian 12): runs a command in a private mount namespace in which
# the Debian packages that scripts/gpu/gpu_carry.sh carries to the GPU machine (and their -dev/plugin
# relatives) are hidden, so that the command sees what the GPU machine has: no OpenMPI, PMIx, hwloc,
# libevent, UCX, libfabric, nlohmann-json, CLI11, SentencePiece, GoogleTest or pkg-config.
#   bash scripts/gpu/gpu_hide_system_deps.sh CMD [ARGS...]
# Every file of those packages is covered by /dev/null and their private directories by an empty
# tmpfs; nothing outside the namespace changes. Used by `gpu_check.sh --cpu-rehearsal --hide-system-deps`.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
if [ "${SHARDLM_IN_HIDDEN_NS:-}" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "gpu_hide_system_deps: needs root (mount namespace)" >&2; exit 1; }
  exec env SHARDLM_IN_HIDDEN_NS=1 unshare -m --propagation private bash "${BASH_SOURCE[0]}" "$@"
fi

PKGS="libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2 libpmix-dev libhwloc15 libhwloc-dev
libhwloc-plugins libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-2.1-7 libevent-extra-2.1-7
libevent-openssl-2.1-7 libevent-dev libfabric1 libucx0 libibverbs1 libibverbs-dev ibverbs-providers
librdmacm1 libnl-3-200 libnl-route-3-200 libnl-3-dev libnl-route-3-dev libpsm2-2 libpsm-infinipath1
libmunge2 libnuma1 libnuma-dev libltdl7 libltdl-dev libpciaccess0 libgfortran5 nlohmann-json3-dev
libcli11-dev libsentencepiece-dev libsentencepiece0 sentencepiece libgtest-dev libgmock-dev googletest
pkgconf pkgconf-bin libpkgconf3 pkg-config openssh-client"
installed=()
for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && installed+=("$p"); done

arch=x86_64-linux-gnu
dirs=(/usr/lib/$arch/openmpi /usr/lib/$arch/pmix2 /usr/share/openmpi /etc/openmpi /usr/include/nlohmann
      /usr/include/CLI /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 /usr/lib/$arch/cmake/GTest
      /usr/include/gtest /usr/src/googletest /usr/lib/$arch/ucx /usr/lib/$arch/libfabric
      /usr/lib/$arch/fortran/gfortran-mod-15/openmpi /usr/lib/$arch/hwloc /usr/lib/libpsm1)
for d in "${dirs[@]}"; do [ -d "$d" ] && mount -t tmpfs -o size=1m,mode=755 none "$d"; done
n=0
while IFS= read -r f; do
  case "$f" in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;; esac
  [ -e "$f" ] || [ -L "$f" ] || continue
  [ -d "$f" ] && [ ! -L "$f" ] && continue
  [ -e "$f" ] || continue  # a link into a hidden directory already dangles
  mount --bind /dev/null "$f" 2>/dev/null && n=$((n + 1))
done < <(dpkg -L "${installed[@]}" 2>/dev/null)
# Alternatives (mpirun, mpicxx, libmpi.so, mpi.pc, the mpi include link) point into hidden paths.
for f in /etc/alternatives/mpi* /etc/alternatives/libmpi*; do [ -e "$f" ] && mount --bind /dev/null "$f" 2>/dev/null; done
echo "gpu_hide_system_deps: hid ${#installed[@]} packages (${n} files, ${#dirs[@]} directories)"
exec "$@"
