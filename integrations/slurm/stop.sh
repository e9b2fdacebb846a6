#!/usr/bin/env bash
# Stops the one-node SLURM started by start.sh: cancels its jobs, then ends slurmd,
# slurmctld and munged by the PIDs in their pid files. Safe to run when nothing runs.
# Touches nothing of any other SLURM on the machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../common.sh"
run="$DISTENV_RUN_DIR/slurm1"
conf="$run/slurm.conf"

if [ -f "$conf" ] && pid_alive "$run/slurmctld.pid"; then
    export SLURM_CONF="$conf"
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
        log "cancelling jobs"
        scancel --full --user=root 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
fi
kill_pidfile "$run/slurmd.pid" slurmd
kill_pidfile "$run/reaper.pid" "slurmd reaper"
kill_pidfile "$run/slurmctld.pid" slurmctld
kill_pidfile "$run/munge/munged.pid" munged
log "one-node SLURM stopped"
