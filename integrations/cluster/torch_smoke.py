"""Cross-node rendezvous smoke test: gloo all_reduce between the two nodes.

Run under any launcher on the namespace cluster; the rank variables are taken by
hand from what the launcher set (no distenv import), then torch.distributed
runs init_process_group("gloo") + all_reduce over real TCP between node1/node2.

  mpirun ... python torch_smoke.py        (Open MPI 4/5, MPICH, Intel MPI)
  srun -N2 ... python torch_smoke.py      (SLURM tasks)
  torchrun ... torch_smoke.py             (torchrun sets everything itself)

MASTER_ADDR defaults to the launch host where the launcher tells it (Open MPI 4
hnp_uri, Open MPI 5 PMIX_NAMESPACE, first host of SLURM_STEP_NODELIST), else node1.
MASTER_PORT defaults to 29577 (+ SLURM job id mod 1000 under SLURM).
"""
import datetime
import os
import re
import socket
import sys


def first(*names):
    for n in names:
        if os.environ.get(n, "") != "":
            return os.environ[n]
    return None


def guess_master():
    uri = os.environ.get("OMPI_MCA_orte_hnp_uri")  # "<jobfam>.0;tcp://a,b,c:port;tcp6://..."
    if uri:
        m = re.search(r"tcp://([0-9.,]+):", uri)
        if m:
            addrs = [a for a in m.group(1).split(",") if not a.startswith("127.")]
            if addrs:
                return addrs[0]
    ns = os.environ.get("PMIX_NAMESPACE", "")  # Open MPI 5: prterun-<host>-<pid>@1
    m = re.match(r"prterun-(.+)-\d+@\d+$", ns)
    if m:
        return m.group(1)
    nl = first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
    if nl:  # enough for this cluster's lists: "node1", "node[1-2]", "node[1,2]", "node1,node2"
        m = re.match(r"([^\[,]+)(?:\[(\d+))?", nl)
        return m.group(1) + (m.group(2) or "")
    return "node1"


def main():
    rank = first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
    size = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if rank is None or size is None:
        sys.exit("torch_smoke: no rank/size variables from any launcher")
    os.environ["RANK"], os.environ["WORLD_SIZE"] = rank, size
    os.environ.setdefault("MASTER_ADDR", guess_master())
    port = 29577 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000
    os.environ.setdefault("MASTER_PORT", str(port))

    import torch
    import torch.distributed as dist

    rank, size = int(rank), int(size)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    want = size * (size + 1) / 2
    # gather every rank's hostname too: proves the group spans both nodes
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname())
    ok = t.item() == want and len(set(hosts)) >= 2
    print(f"rank={rank}/{size} host={socket.gethostname()} master={os.environ['MASTER_ADDR']}:"
          f"{os.environ['MASTER_PORT']} gloo_if={os.environ.get('GLOO_SOCKET_IFNAME', '-')} "
          f"all_reduce={t.item():g} (want {want:g}) hosts={','.join(hosts)} {'OK' if ok else 'BAD'}",
          flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
