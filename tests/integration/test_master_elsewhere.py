"""A master address set by hand that is not rank 0's host (issue 42, item 4), on the two
namespace nodes: torch's store would listen on rank 0's host and every rank wait on the other
(30 minutes by torch's default). At bring-up every rank refuses it in one line naming both,
where the launch places rank 0 -- its own variables (SLURM's block layout) or the launcher's
service (SLURM arbitrary, Open MPI 5, MPICH 4) -- by the other host's name or its address (the
names looked up); rank 0's own host, given by another name of it, passes."""
from __future__ import annotations

import pytest

import harness
from test_hpc_interfaces import ARBITRARY_HOSTS, NODE2_FIRST, WRAPPED

pytestmark = [pytest.mark.launcher, pytest.mark.cluster, pytest.mark.timeout(900)]

PROBE = str(harness.HERE / "discover_probe.py")
BLOCK = harness.Layout("slurm", "block-n2", "slurm2", 2, "slurm", "slurm",
                       lambda cmd, extra: ["srun", "-N2", "-n2", *extra, *cmd], ("node1", "node2"))
#: layout -> where its rank 0 runs, the other host
CASES = {
    "srun-block": (BLOCK, ["node1", "node2"]),
    "srun-arbitrary": (WRAPPED["srun-pmix"][0], ARBITRARY_HOSTS),
    "openmpi5": (WRAPPED["openmpi5"][0], NODE2_FIRST),
    "mpich4": (WRAPPED["mpich4"][0], NODE2_FIRST),
}


def _records(lay, given, extra_env=None):
    result = harness.launch(lay, [harness.PY, PROBE, "bring-up"], env={"MASTER_ADDR": given, **(extra_env or {})},
                            extra=("-x", "MASTER_ADDR") if lay.launcher == "openmpi5" else (),
                            timeout=300)
    records = [r for out, _ in result["files"].values() for r in harness.parse_records(out)]
    assert len(records) == lay.nranks, result["files"]
    return records


@pytest.mark.parametrize("case", list(CASES))
def test_another_hosts_name_or_address_is_refused_on_every_rank_and_rank_0s_passes(need, case):
    lay, hosts = CASES[case]
    lay = need(lay)
    first = hosts[0]
    other = next(h for h in hosts if h != first)
    for r in _records(lay, other):
        assert r["given"] == other, r  # the variable reached every rank
        error = r.get("error", "")
        assert f"master_addr={other}" in error and f"rank 0 runs on {first}" in error, r
        assert error.count("Fix:") == 1 and "\n" not in error, r
    for r in _records(lay, harness.NODE_IP[other]):  # the other host's address: refused too
        error = r.get("error", "")
        assert f"master_addr={harness.NODE_IP[other]}" in error and \
            f"is an address of {other}, another host of the job, but rank 0 runs on {first}" in error, r
    for r in _records(lay, harness.NODE_IP[first]):  # another name of rank 0's host: fine
        assert "error" not in r and r["env"]["master_addr"] == harness.NODE_IP[first], r


def test_a_per_node_launch_refuses_a_master_on_another_node_than_node_0(need):
    """srun -N2 -n2, one task per node, DISTENV_NPROC_PER_NODE=2 (what `distenv run` and
    Lightning start workers from): node 0's torchrun binds the master port on node1, so
    MASTER_ADDR=node2 (or node2's address) is refused on both nodes; node1's address passes."""
    lay = need(BLOCK)
    per_node = {"DISTENV_NPROC_PER_NODE": "2"}
    for given in ("node2", harness.NODE_IP["node2"]):
        for r in _records(lay, given, per_node):
            error = r.get("error", "")
            assert f"master_addr={given}" in error and "rank 0 runs on node1" in error, r
    for r in _records(lay, harness.NODE_IP["node1"], per_node):
        assert "error" not in r and r["env"]["launch"] == "per-node", r


#: A forwarder on node2 (a load balancer, a NAT, a Kubernetes service, a published container
#: port in one): it listens at its PORT and pipes each connection to TARGET:PORT; with no
#: target it is "another program" that takes the connection and never answers.
FORWARDER = r'''
import socket, sys, threading
port, target = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else None)
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("0.0.0.0", port)); ls.listen(8); print("ready", flush=True)
def pipe(a, b):
    try:
        while (data := a.recv(4096)):
            b.sendall(data)
    except OSError:
        pass
    finally:
        b.close()
held = []
while True:
    c, _ = ls.accept()
    if target is None:
        held.append(c); continue
    u = socket.create_connection((target, port))
    for a, b in ((c, u), (u, c)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
'''


def _rank_0(given, port):
    """distenv.torch's bring-up of rank 0 of 2 on node1, set by hand (no launcher places it)."""
    import os
    import subprocess

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": given, "MASTER_PORT": str(port)}
    p = subprocess.run([harness.ON_NODE, "node1", harness.PY, PROBE, "torch"], env=env,
                       capture_output=True, text=True, timeout=120)
    records = harness.parse_records(p.stdout)
    assert len(records) == 1, (p.stdout, p.stderr)
    return {**records[0], "stderr": p.stderr}


def _on_node2(port, *target):
    import subprocess

    p = subprocess.Popen([harness.ON_NODE, "node2", harness.PY, "-c", FORWARDER, str(port), *target],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_rank_0_alone_warns_of_an_address_that_does_not_lead_to_it(cluster):
    """Where nothing places rank 0 (RANK, WORLD_SIZE, MASTER_ADDR by hand), rank 0 itself dials
    the master address at the master port while it listens there: node2 refusing (nothing at
    the port) and node2 with another program there are warnings naming both hosts, never errors
    (a forwarder whose backend, rank 0's store, is not listening yet answers so too, on node1's
    own network as well); node2 forwarding to node1 (a load balancer's or a NAT's address, none
    of node1's own) and node1's own address pass in silence."""
    import random

    port = random.randint(21000, 28999)
    for given in ("node2", harness.NODE_IP["node2"]):
        r = _rank_0(given, port)
        assert "error" not in r and r["env"]["master_addr"] == given, r
        assert f"master_addr={given} (MASTER_ADDR) is none of the addresses of node1, where rank 0 " \
               f"runs, and {given}:{port} dialed from there refused the connection" in r["stderr"], r
        assert r["stderr"].count("Fix:") == 1, r
    other = _on_node2(port)
    try:
        r = _rank_0("node2", port)
        assert "error" not in r and r["env"]["master_addr"] == "node2", r
        assert "master_addr=node2 (MASTER_ADDR) is none of the addresses of node1, where rank 0 " \
               f"runs, and node2:{port} dialed from there is answered by another program" in r["stderr"], r
        assert r["seconds"] < 10, r  # its bound: the lookup, the connect and the token's wait
    finally:
        other.kill()
        other.wait()
    forward = _on_node2(port, harness.NODE_IP["node1"])
    try:
        r = _rank_0("node2", port)
        assert "error" not in r and r["env"]["master_addr"] == "node2" and "node2" not in r["stderr"], r
    finally:
        forward.kill()
        forward.wait()
    for given in ("node1", harness.NODE_IP["node1"]):
        r = _rank_0(given, port)
        assert "error" not in r and r["env"]["master_addr"] == given, r
