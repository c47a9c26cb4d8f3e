# Sourced (not run) by scripts/gpu/gpu_check.sh on the GPU machine, which has no package registry:
#   source scripts/gpu/gpu_deps.sh DEBS_DIR
# unpacks every carried Debian .deb (scripts/gpu/gpu_carry.sh downloads them into .gpu_carry/debs) with
# `dpkg -x` into $SHARDLM_DEPS_DIR (default /tmp/shardlm_deps; never /) and exports what the build and
# the runs need to find them there:
#   CMAKE_PREFIX_PATH (nlohmann_json, CLI11, GTest configs), PKG_CONFIG_PATH (sentencepiece.pc, its
#   prefix rewritten), CPATH, PATH (pkg-config if the system has none; mpirun/mpicxx), and for the
#   carried OpenMPI: LD_LIBRARY_PATH, OPAL_PREFIX (Debian builds OpenMPI for prefix /usr; OPAL_PREFIX
#   relocates its components, help files and wrapper data), PMIX_INSTALL_PREFIX and PMIx's component
#   path, and the MCA defaults of Debian's /etc/openmpi/openmpi-mca-params.conf (sysconfdir is not
#   relocated, so they are given as OMPI_MCA_* variables).
# A system MPI (mpirun and mpicxx on PATH, or mpi.h under /usr/include) is preferred unless
# SHARDLM_CARRIED_MPI=1. Sets (not exported): DEPS_STATUS ok|failed, DEPS_REASON, DEPS_MPI
# system|carried|none, DEPS_MISSING_LIBS (sonames ldd could not resolve in the carried MPI).
# Written for `set -u`; never exits the calling shell.

gpu_deps_setup() {
  local debs=${1:-.gpu_carry/debs} d=${SHARDLM_DEPS_DIR:-/tmp/shardlm_deps} f n=0
  DEPS_STATUS=failed DEPS_REASON="" DEPS_MPI=none DEPS_MISSING_LIBS="" DEPS_DIR=$d
  if [ "$d" = "/" ] || [ -z "$d" ]; then DEPS_REASON="refusing to unpack into /"; return 1; fi
  if ! command -v dpkg >/dev/null; then DEPS_REASON="no dpkg on this machine"; return 1; fi
  rm -rf "$d" && mkdir -p "$d/bin" || { DEPS_REASON="cannot create $d"; return 1; }
  shopt -s nullglob
  for f in "$debs"/*.deb; do
    dpkg -x "$f" "$d" || { DEPS_REASON="dpkg -x $f failed"; shopt -u nullglob; return 1; }
    n=$((n + 1))
  done
  shopt -u nullglob
  DEPS_DEBS=$n
  [ "$n" -gt 0 ] || echo "gpu_deps: no .deb in $debs (run scripts/gpu/gpu_carry.sh here and carry .gpu_carry)"

  local arch=x86_64-linux-gnu
  # pkg-config files: absolute prefix /usr -> the unpacked tree.
  for f in "$d"/usr/lib/$arch/pkgconfig/*.pc "$d"/usr/share/pkgconfig/*.pc; do
    [ -f "$f" ] && [ ! -L "$f" ] && sed -i "s|^prefix=/usr\$|prefix=$d/usr|" "$f"
  done
  export PKG_CONFIG_PATH="$d/usr/lib/$arch/pkgconfig:$d/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$d/usr"
  export CPATH="${CPATH:+$CPATH:}$d/usr/include"
  if ! pkg-config --version >/dev/null 2>&1 && [ -x "$d/usr/bin/pkgconf" ]; then
    ln -sf "$d/usr/bin/pkgconf" "$d/bin/pkg-config"
  fi
  export PATH="$d/bin:$PATH"

  local sys_mpi=0
  if [ "${SHARDLM_CARRIED_MPI:-0}" != 1 ]; then
    # A working mpirun plus something to build with: the mpicxx wrapper, or mpi.h in a standard place.
    if mpirun --version >/dev/null 2>&1; then
      if mpicxx --showme:version >/dev/null 2>&1 || [ -s /usr/include/mpi.h ] ||
         ls /usr/include/*/mpi.h >/dev/null 2>&1; then sys_mpi=1; fi
    fi
  fi
  if [ $sys_mpi = 1 ]; then
    DEPS_MPI=system
    echo "gpu_deps: using the system MPI: $(command -v mpirun) ($(mpirun --version 2>&1 | head -1))"
  elif [ -x "$d/usr/bin/orterun" ]; then
    DEPS_MPI=carried
    local ompi=$d/usr/lib/$arch/openmpi
    for t in mpirun mpiexec; do ln -sf "$d/usr/bin/orterun" "$d/bin/$t"; done
    for t in mpicxx mpic++ mpiCC mpicc; do ln -sf "$d/usr/bin/opal_wrapper" "$d/bin/$t"; done
    # Debian points libpsm_infinipath.so.1 at its file through update-alternatives, which dpkg -x skips.
    for f in "$d"/usr/lib/libpsm1/libpsm_infinipath.so.1.*; do
      [ -f "$f" ] && ln -sf "$(basename "$f")" "$d/usr/lib/libpsm1/libpsm_infinipath.so.1"
    done
    export LD_LIBRARY_PATH="$d/usr/lib/$arch:$d/lib/$arch:$d/usr/lib/libpsm1:$ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OPAL_PREFIX="$d/usr"
    export PMIX_INSTALL_PREFIX="$d/usr/lib/$arch/pmix2"
    export PMIX_MCA_mca_base_component_path="$d/usr/lib/$arch/pmix2/lib/pmix"
    f="$d/usr/lib/$arch/pmix2/share/pmix-mca-params.conf"
    [ -f "$f" ] && sed -i "s|/usr/lib/$arch/pmix2|$d/usr/lib/$arch/pmix2|g" "$f"
    # Debian's /etc/openmpi/openmpi-mca-params.conf, which the relocated tree does not read.
    export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_mtl='^ofi' OMPI_MCA_btl='^uct,openib,ofi'
    export OMPI_MCA_pml='^ucx' OMPI_MCA_osc='^ucx,pt2pt'
    # No ssh on the machine; a local job never calls the agent, but the rsh launcher wants one.
    export OMPI_MCA_plm_rsh_agent=false
    # CMake's FindMPI: the wrapper (opal_wrapper reads its data under OPAL_PREFIX).
    export MPI_HOME="$ompi"
    # Shared libraries the carried MPI needs that neither the carry nor the system provides.
    local missing
    missing=$(for f in "$d/usr/bin/orterun" "$d/usr/bin/orted" "$d"/usr/lib/$arch/libmpi.so.40 \
                       "$d"/usr/lib/$arch/libmpi_cxx.so.40 "$d"/usr/lib/$arch/libopen-*.so.40 \
                       "$ompi"/lib/openmpi3/mca_*.so; do
                ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'
              done | sort -u | tr '\n' ' ')
    DEPS_MISSING_LIBS=${missing% }
    [ -n "$DEPS_MISSING_LIBS" ] && echo "gpu_deps: libraries not found for the carried MPI (components needing them will not load): $DEPS_MISSING_LIBS"
  else
    DEPS_REASON="no system MPI and no carried OpenMPI in $debs"
    return 1
  fi
  hash -r  # PATH changed: forget where bash found mpirun/pkg-config before
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # VMs and containers often refuse cross-memory attach (process_vm_readv); copy through shared memory.
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  DEPS_STATUS=ok
  return 0
}
