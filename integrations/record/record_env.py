#!/usr/bin/env python3
"""Print, as ONE JSON line on stdout, what a distributed launcher told this process.

Run it as every rank of a launcher (``mpirun -np 4 python record_env.py``, ``srun -n4 ...``,
``torchrun --no-python --nproc-per-node 2 python record_env.py``). Output:

    {"hostname": "...", "pid": 123, "env": {"OMPI_COMM_WORLD_RANK": "0", ...}}

plus, under Cray PALS (``PALS_APINFO``), ``"apinfo"``: the placement file, base64.

Standard library only, so any python3 works (the launcher's venv, the system one).

Which variables: only launcher variables, i.e. names that start with one of PREFIXES or
equal one of NAMES below. Everything else (PATH, HOME, the user's own variables) is left
out.

Which values are dropped (the name stays, with a placeholder, so that the *presence* of a
variable, which detectors use as a marker, is still recorded):

* secrets -> "<redacted>": a name containing KEY, TOKEN, SECRET, PASSW, CRED, COOKIE or
  TRANSPORTS (Open MPI's ``OMPI_MCA_orte_precondition_transports`` is a per-job
  pre-shared key for PSM).
* machine paths -> "<path>": any value containing "/", unless
    - it contains "://" (a URI: ``OMPI_MCA_orte_hnp_uri``,
      ``OMPI_MCA_orte_local_daemon_uri``, ``PMIX_SERVER_URI*``, ...). Those are kept,
      addresses and ports included, because detectors read the head node from them;
    - or the name is a node/host list (ends in NODELIST, NODE_LIST, HOSTLIST, HOSTS or
      NODENAME), where a "/" would be part of a host name pattern, not a path.
  Examples dropped: ``PMIX_SERVER_TMPDIR``, ``OMPI_FILE_LOCATION``, ``SLURM_SUBMIT_DIR``,
  ``SLURM_CONF``, ``TORCHELASTIC_ERROR_FILE``, ``I_MPI_ROOT``.
Host names and IP addresses are kept: they are what the fixtures are for.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys

PREFIXES = (
    "OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "HYDRA_", "I_MPI_", "MV2_", "SLURM_", "SLURMD_",
    "TORCHELASTIC_", "PALS_", "FLUX_", "JSM_", "LSB_", "HOROVOD_",
)
NAMES = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    # the DeepSpeed launcher's per-node agent (deepspeed.launcher.launch) adds these three
    "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
}
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CRED|COOKIE|TRANSPORTS", re.I)
LIST_NAME = re.compile(r"(NODELIST|NODE_LIST|HOSTLIST|HOSTS|NODENAME)$", re.I)


def is_launcher_var(name: str) -> bool:
    return name in NAMES or name.startswith(PREFIXES)


def clean_value(name: str, value: str) -> str:
    if SECRET_NAME.search(name):
        return "<redacted>"
    if "/" in value and "://" not in value and not LIST_NAME.search(name):
        return "<path>"
    return value


def record(environ: dict[str, str] | None = None) -> dict:
    environ = os.environ if environ is None else environ
    env = {k: clean_value(k, v) for k, v in sorted(environ.items()) if is_launcher_var(k)}
    out = {"hostname": socket.gethostname(), "pid": os.getpid(), "env": env}
    apinfo = environ.get("PALS_APINFO")
    if apinfo:  # Cray PALS's placement file (distenv.discovery.apinfo): kept whole, base64
        import base64

        try:
            with open(apinfo, "rb") as f:
                out["apinfo"] = base64.b64encode(f.read(1 << 20)).decode()
        except OSError as exc:
            out["apinfo_error"] = exc.strerror or str(exc)
    return out


def main() -> int:
    line = json.dumps(record(), sort_keys=True)
    # One write, so lines of ranks sharing a pipe do not interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
