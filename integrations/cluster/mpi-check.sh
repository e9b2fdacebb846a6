#!/bin/bash
# Run each available MPI as 2x2 over node1,node2 with mpirun/mpiexec itself
# inside node1 and ./fakessh as the remote agent. The test program
# (mpi_hello.c) does an Allreduce and a ring exchange, so ranks on the two
# nodes really talk over the bridge, and checks each rank's host and IP.
# Usage: mpi-check.sh [ompi4|ompi5|mpich4|mpich5|impi]...   (default: all found)
set -euo pipefail
. "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
L=${DISTENV_LAUNCHERS_DIR:-/opt/distenv-launchers}
B=$CLUSTER_STATE/bin; mkdir -p "$B"
SSH=$CLUSTER_DIR/fakessh
NET=$CLUSTER_PREFIX.0/24
ON1=("$CLUSTER_DIR/on-node" node1 timeout -k 5 120)

build() { # name compiler [link flags...]   (flags go after the source: link order matters)
  local out=$B/hello-$1 cc=$2; shift 2
  [ "$out" -nt "$CLUSTER_DIR/mpi_hello.c" ] || "$cc" -O2 -o "$out" "$CLUSTER_DIR/mpi_hello.c" "$@"
}
run() { # name argv...  -> checks output
  local name=$1; shift
  local t0=$(date +%s.%N) out
  out=$("$@" 2>&1) || { echo "FAIL $name (exit $?)"; echo "$out"; return 1; }
  local t1=$(date +%s.%N)
  echo "$out" | sort
  local ok=1
  for r in 0 1 2 3; do
    # block mapping: ranks 0,1 on node1, ranks 2,3 on node2
    want=node$(( r / 2 + 1 )); ip=$(cluster_addr "$want")
    echo "$out" | grep -q "^rank=$r size=4 host=$want ip=$ip .* OK$" || ok=0
  done
  [ $ok = 1 ] && echo "PASS $name ($(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s)" || { echo "FAIL $name"; return 1; }
}

build_only=0; [ "${1:-}" = --build-only ] && { build_only=1; shift; }
run_() { [ $build_only = 1 ] || run "$@"; }
want=${*:-ompi4 ompi5 mpich4 mpich5 impi}
rc=0
for m in $want; do
  case $m in
  ompi4)
    command -v mpicc.openmpi >/dev/null || { echo "SKIP ompi4"; continue; }
    build ompi4 mpicc.openmpi
    run_ ompi4 "${ON1[@]}" mpirun --allow-run-as-root -np 4 -H node1:2,node2:2 \
      --mca plm_rsh_agent "$SSH" --mca oob_tcp_if_include "$NET" --mca btl_tcp_if_include "$NET" \
      "$B/hello-ompi4" || rc=1 ;;
  ompi5)
    [ -x "$L/openmpi5/bin/mpirun" ] || { echo "SKIP ompi5"; continue; }
    build ompi5 "$L/openmpi5/bin/mpicc"
    run_ ompi5 "${ON1[@]}" "$L/openmpi5/bin/mpirun" --allow-run-as-root -np 4 -H node1:2,node2:2 \
      --map-by ppr:2:node --prtemca plm_ssh_agent "$SSH" \
      --prtemca oob_tcp_if_include "$NET" --mca btl_tcp_if_include "$NET" \
      "$B/hello-ompi5" || rc=1 ;;
  mpich4)
    command -v mpicc.mpich >/dev/null || { echo "SKIP mpich4"; continue; }
    build mpich4 mpicc.mpich
    run_ mpich4 "${ON1[@]}" mpiexec.mpich -np 4 -hosts node1:2,node2:2 \
      -launcher ssh -launcher-exec "$SSH" "$B/hello-mpich4" || rc=1 ;;
  mpich5)
    [ -x "$L/mpich5/bin/mpiexec" ] || { echo "SKIP mpich5"; continue; }
    build mpich5 "$L/mpich5/bin/mpicc"
    run_ mpich5 "${ON1[@]}" "$L/mpich5/bin/mpiexec" -np 4 -hosts node1:2,node2:2 \
      -launcher ssh -launcher-exec "$SSH" "$B/hello-mpich5" || rc=1 ;;
  impi)
    [ -x "$L/impi/bin/mpiexec.hydra" ] || { echo "SKIP impi"; continue; }
    # impi-rt ships no mpicc: build against MPICH's headers (same ABI) and Intel's libmpi.so.12
    build impi gcc -I/usr/include/x86_64-linux-gnu/mpich -L"$L/impi/lib" -Wl,-rpath,"$L/impi/lib" -lmpi
    run_ impi "${ON1[@]}" "$L/impi/bin/mpiexec.hydra" -np 4 -hosts node1,node2 -ppn 2 \
      -bootstrap ssh -bootstrap-exec "$SSH" "$B/hello-impi" || rc=1 ;;
  *) echo "unknown: $m" >&2; rc=2 ;;
  esac
done
exit $rc
