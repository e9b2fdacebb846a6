"""The real DeepSpeed runner (`deepspeed`, DeepSpeed 0.19 on CPU) as a launcher (issue 24).

One node: ``deepspeed --num_gpus 2 --master_port P script``. There is no GPU here; DeepSpeed's
CPU accelerator then counts no devices, and without a host file the runner stops with
"Unable to proceed, no GPU resources available" -- unless --num_gpus is given: the runner
then deals that many slots to localhost (runner.py apply_num_nodes_and_gpus) and its
per-node agent (deepspeed.launcher.launch) starts one process per slot with RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR=127.0.0.1 and
MASTER_PORT.

Two nodes: ``deepspeed --hostfile H --launcher openmpi`` inside node1 of integrations/cluster,
H naming node1 and node2 with ``slots=2``. The runner first checks the first host with
``ssh HOST hostname`` and asks it ``hostname -I`` for a master address (an `ssh` on PATH
that is the fake ssh answers), then runs ``mpirun -n 4 -hostfile H ... python script`` (the first mpirun on PATH: Debian's
Open MPI 4.1); the
launcher arguments give mpirun the fake ssh as its agent and the cluster's subnet. The ranks
are Open MPI ranks (the runner's openmpi mode starts no per-node agent, and passes no RANK
or MASTER_ADDR): DeepSpeed's own ``init_distributed`` would need mpi4py there, which
distenv.deepspeed.init_distributed replaces.

Every rank (tests/integration/framework_rank_probe.py): distenv.resolve() against the
variables the runner (or its mpirun) set and the rank's real host name, then
distenv.deepspeed.init_distributed("gloo") (DeepSpeed's init with auto_mpi_discovery=False)
and a gloo all-reduce of rank + 1 across all ranks.

Runs with .venvs/deepspeed (DeepSpeed and torch, distenv installed); missing: a skip, which
DISTENV_REQUIRE_LAUNCHERS=1 (CI) makes a failure.
"""
import json
import os
import socket
import subprocess

import pytest

import harness

pytestmark = [pytest.mark.launcher, pytest.mark.timeout(300)]

VENV = harness.REPO / ".venvs" / "deepspeed"
PROBE = harness.HERE / "framework_rank_probe.py"


def _runner():
    run, py = VENV / "bin" / "deepspeed", VENV / "bin" / "python"
    if not (os.access(run, os.X_OK) and os.access(py, os.X_OK)):
        pytest.skip("no DeepSpeed runner (.venvs/deepspeed/bin/deepspeed): "
                    "bash integrations/frameworks/deepspeed.sh")
    return run


def _held_port():
    """A free port and the socket holding it for the run: bound with SO_REUSEADDR, never
    listening, so no other process takes it before rank 0's TCPStore (SO_REUSEADDR too)
    listens beside it (as tests/reliability/jobs.py free_ports)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


#: The CPU op DeepSpeed's TorchBackend JIT-compiles at init_distributed, built once by
#: integrations/frameworks/deepspeed.sh (docs/frameworks/deepspeed.md). Without it every run
#: compiles into ~/.cache/torch_extensions: about a minute on a quiet 2-core machine, past the
#: 150 s limit under a CI run's load (where both tests once timed out with no record).
EXTENSIONS = os.environ.get("TORCH_EXTENSIONS_DIR") or str(VENV / "torch-extensions")


def _env(**extra):
    env = harness.clean_env({"PYTHONUNBUFFERED": "1", "DISTENV_TIMEOUT": "90",
                             "TORCH_EXTENSIONS_DIR": EXTENSIONS, **extra})
    env.pop("PYTHONPATH", None)
    return env


def _launch(argv, env, out, n, cwd):
    p = subprocess.run([str(a) for a in argv], env=env, cwd=str(cwd), capture_output=True,
                       text=True, timeout=170, stdin=subprocess.DEVNULL)
    files = sorted(out.glob("rank-*.rec"))
    recs = [json.loads(f.read_text().split("REC ", 1)[1]) for f in files]
    log = p.stdout[-4000:] + p.stderr[-4000:]
    assert p.returncode == 0 and len(recs) == n, f"exit {p.returncode}, {len(recs)} records\n{log}"
    return recs, log


def test_deepspeed_runner_one_node(tmp_path):
    run = _runner()
    out = tmp_path / "out"
    out.mkdir()
    held, port = _held_port()
    argv = ["timeout", "-k", "5", "150", run, "--num_gpus", "2", "--master_port", port,
            PROBE, "deepspeed", out]
    with held:
        recs, log = _launch(argv, _env(), out, 2, tmp_path)
    recs.sort(key=lambda r: int(r["v"]["RANK"]))
    assert [r["v"]["RANK"] for r in recs] == ["0", "1"], log
    for r in recs:
        d, v, used = r["d"], r["v"], r["used"]
        assert r["host"] == harness.LOCALHOST, r
        # the runner's own variables, as measured (not distenv's)
        assert (v["WORLD_SIZE"], v["LOCAL_SIZE"], v["CROSS_RANK"], v["CROSS_SIZE"]) == \
            ("2", "2", "0", "1"), r
        assert (v["MASTER_ADDR"], v["MASTER_PORT"]) == ("127.0.0.1", str(port)), r
        assert d["launcher"] == "deepspeed" and d["launch"] == "per-process", d
        assert (d["rank"], d["world_size"]) == (int(v["RANK"]), int(v["WORLD_SIZE"])), r
        assert (d["local_rank"], d["local_world_size"]) == (int(v["LOCAL_RANK"]), int(v["LOCAL_SIZE"])), r
        assert (d["node_rank"], d["num_nodes"]) == (int(v["CROSS_RANK"]), int(v["CROSS_SIZE"])), r
        assert (d["master_addr"], d["master_port"]) == (v["MASTER_ADDR"], int(v["MASTER_PORT"])), r
        assert {k: used[k] for k in ("rank", "world_size", "master_addr", "master_port")} == \
            {k: d[k] for k in ("rank", "world_size", "master_addr", "master_port")}, r
        assert r["dist_rank"] == d["rank"] and r["world"] == 2 and r["sum"] == 3.0, r



@pytest.mark.cluster
def test_deepspeed_runner_openmpi_two_nodes(cluster, tmp_path):
    run = _runner()
    out = tmp_path / "out"
    out.mkdir()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    # mpirun passes no environment to node2's ranks unless exported: the runner exports what a
    # .deepspeed_env in its working directory names (runner.py DEEPSPEED_ENVIRONMENT_PATHS)
    (tmp_path / ".deepspeed_env").write_text(f"TORCH_EXTENSIONS_DIR={EXTENSIONS}\n")
    env = _env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # The runner calls `ssh` from PATH (runner.py: `ssh -o PasswordAuthentication=no HOST
    # hostname`, then `ssh HOST hostname -I`).
    env["PATH"] = f"{harness.ssh_on_path(tmp_path)}:{env.get('PATH', '/usr/bin:/bin')}"
    mpi_args = (f"--mca plm_rsh_agent {harness.FAKESSH} --mca oob_tcp_if_include {harness.NET} "
                f"--mca btl_tcp_if_include {harness.NET}")
    argv = ["timeout", "-k", "5", "150", harness.ON_NODE, "node1", run, "--hostfile", hostfile,
            "--launcher", "openmpi", "--launcher_args", mpi_args, PROBE, "deepspeed", out]
    recs, log = _launch(argv, env, out, 4, tmp_path)
    recs.sort(key=lambda r: int(r["v"]["OMPI_COMM_WORLD_RANK"]))
    assert [r["host"] for r in recs] == ["node1", "node1", "node2", "node2"], log
    for r in recs:
        d, v, used = r["d"], r["v"], r["used"]
        # mpirun's own numbering; the runner's openmpi mode passes no torch variables
        assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & set(v), r
        assert d["launcher"] == "openmpi" and d["launch"] == "per-process", d
        assert (d["rank"], d["world_size"]) == \
            (int(v["OMPI_COMM_WORLD_RANK"]), int(v["OMPI_COMM_WORLD_SIZE"])) == (r["dist_rank"], 4), r
        assert (d["local_rank"], d["local_world_size"]) == \
            (int(v["OMPI_COMM_WORLD_LOCAL_RANK"]), int(v["OMPI_COMM_WORLD_LOCAL_SIZE"])), r
        assert r["host"] == ("node1", "node2")[int(v["OMPI_COMM_WORLD_RANK"]) // 2], r
        # Open MPI 4 names no node index (OMPI_COMM_WORLD_NODE_RANK is a local rank:
        # docs/launchers.md#trap-1), so distenv leaves it unknown, as in the openmpi4-2x2
        # layout; the counts it knows
        assert v["OMPI_COMM_WORLD_NODE_RANK"] == v["OMPI_COMM_WORLD_LOCAL_RANK"], r
        assert (d["node_rank"], d["num_nodes"], d["nproc_per_node"]) == (None, 2, 2), r
        # rank 0's node, found in Open MPI's variables (mpirun runs on node1, with rank 0)
        assert d["master_addr"] in ("node1", harness.NODE_IP["node1"]), r
        assert used["master_addr"] == d["master_addr"] and used["rank"] == d["rank"], r
        assert r["world"] == 4 and r["sum"] == 10.0, r
    assert len({(r["used"]["master_addr"], r["used"]["master_port"]) for r in recs}) == 1, recs
