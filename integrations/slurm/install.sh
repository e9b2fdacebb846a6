#!/usr/bin/env bash
# Installs SLURM 22.05 and MUNGE from Debian (apt: slurm-wlm munge). Idempotent.
# Daemons are not started here (no systemd needed): integrations/slurm/start.sh does that.
# Prints the path of srun on stdout.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
timed "slurm install" apt_install slurm-wlm munge
# Debian's postinst makes the key; create one if a minimal image skipped it.
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    as_root mkdir -p /etc/munge
    as_root dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
    as_root chown munge:munge /etc/munge /etc/munge/munge.key
    as_root chmod 0700 /etc/munge
    as_root chmod 0400 /etc/munge/munge.key
fi
command -v srun
