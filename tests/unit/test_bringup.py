"""The one bring-up (`distenv.bringup`): resolve, refuse a per-node launch in one wording,
complete what the framework needs from the launcher's service (only when it must, only for this
process's own environment), export, register the teardown. Each adapter and tool calls it; the
refusal reads alike in all of them."""
from __future__ import annotations

import os

import pytest

import distenv
import distenv.discovery
from distenv import DistEnvError, bringup
from envs import ompi, ompi4, recorded

PER_NODE = ompi(1, 2, 0, 1, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2",
                OMPI_MCA_ess_base_jobid="77", OMPI_MCA_orte_hnp_uri="76.0;tcp://10.213.77.11:4000",
                DISTENV_NPROC_PER_NODE="2")


@pytest.fixture
def asked(monkeypatch):
    """distenv.discovery.complete stood in for: the calls it gets."""
    calls = []

    def complete(env, need=("master_addr",), timeout=None):
        calls.append((tuple(need), timeout))
        return env.replace(master_addr="node1")

    monkeypatch.setattr(distenv.discovery, "complete", complete)
    return calls


@pytest.fixture
def registered(monkeypatch):
    from distenv.bringup import teardown as _teardown

    calls = []
    monkeypatch.setattr(_teardown, "register", lambda: calls.append(1))
    return calls


@pytest.mark.parametrize("framework, runs, also", [
    ("torch", "torch.distributed runs one process per worker", "DistenvEnvironment"),
    ("transformers", "the Trainer runs one process per worker", "`accelerate launch`"),
    ("deepspeed", "DeepSpeed runs one process per worker", "the `deepspeed` launcher"),
    ("horovod", "Horovod runs one process per worker", "")])
def test_one_refusal_for_every_framework(framework, runs, also):
    env = distenv.resolve(PER_NODE)
    with pytest.raises(DistEnvError) as err:
        bringup.bring_up(framework, environ=PER_NODE)
    text = str(err.value)
    assert text == bringup.per_node_message(env, framework)
    assert text.startswith("this process is node 1 of 2 of a per-node launch (")
    assert f"it is not a training worker, and {runs}. Fix: start the 2 workers from it, e.g. " \
           f"`torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.213.77.11 " \
           f"--master-port {env.master_port} train.py`" in text
    assert also in text and text.endswith("and unset DISTENV_NPROC_PER_NODE.") and "\n" not in text


def test_the_adapters_refuse_in_those_words(monkeypatch, no_gpus):
    import distenv.deepspeed
    import distenv.horovod
    import distenv.torch
    import distenv.transformers

    env = distenv.resolve(PER_NODE)
    assert distenv.torch.per_node_message(env) == bringup.per_node_message(env, "torch")
    with pytest.raises(DistEnvError) as err:
        distenv.horovod.plan(PER_NODE)
    assert str(err.value) == bringup.per_node_message(env, "horovod")
    for key, value in PER_NODE.items():
        monkeypatch.setenv(key, value)
    for call, name in ((distenv.deepspeed.prepare, "deepspeed"),
                       (distenv.transformers.patch, "transformers")):
        with pytest.raises(DistEnvError) as err:
            call()
        assert str(err.value) == bringup.per_node_message(env, name)


@pytest.mark.parametrize("framework", ["lightning", "jax", "tensorflow", "auto", "run"])
def test_a_per_node_launch_is_allowed_where_the_framework_starts_its_workers(asked, registered, framework):
    """Lightning and distenv run start a node's workers; one JAX process or TensorFlow worker
    may own a node's devices; DISTENV_AUTO hands the node to whichever of them runs."""
    env = bringup.bring_up(framework, environ=PER_NODE, export=bringup.NEVER, teardown=bringup.NEVER)
    assert env.launch == distenv.PER_NODE and asked == [] and registered == []


def test_each_framework_goes_up_as_its_row_says(monkeypatch, asked, registered):
    """The table is what happens: what is exported and when, whether the teardown is
    registered, which fields are asked of the launcher's service."""
    launch = ompi(1, 4, 1, 2)  # rank 1 of 4 under mpirun: rank 0's host and the nodes unknown
    refused = []
    for name, row in bringup.WAYS.items():
        asked.clear()
        registered.clear()
        target: "dict[str, str]" = {}
        if row.per_node == bringup.REFUSE:
            with pytest.raises(DistEnvError) as err:
                bringup.bring_up(name, environ=PER_NODE, target=target)
            assert f"and {row.runs}. Fix: " in str(err.value) and str(err.value).endswith(
                f"{row.others}, or launch one process per worker (e.g. mpirun -np <workers>) and unset "
                "DISTENV_NPROC_PER_NODE."), name
            refused.append(name)
        bringup.bring_up(name, environ=launch, complete=True, target=target)
        # distributed, and Open MPI lets torch's variables be written: all but NEVER act
        assert bool(target) is (row.export != bringup.NEVER), name
        assert bool(registered) is (row.teardown != bringup.NEVER), name
        need = asked[-1][0]
        assert need[:4 if row.nodes else 2] == bringup.needs(distenv.resolve(launch), nodes=row.nodes), name
    assert sorted(refused) == ["deepspeed", "horovod", "torch", "transformers"]
    # one process: the teardown where the framework starts a process group anyway (torch's
    # init_process_group, DeepSpeed's init_distributed: gloo's late thread aborted one at exit)
    ends = []
    for name in bringup.WAYS:
        registered.clear()
        bringup.bring_up(name, environ={}, target={})
        if registered:
            ends.append(name)
    assert sorted(ends) == ["deepspeed", "torch"]


def test_needs():
    d = distenv.resolve(recorded("openmpi4-np4", 1))
    assert bringup.needs(d) == ("master_addr", "world_size")
    assert bringup.needs(d, nodes=True) == ("master_addr", "world_size", "node_rank", "num_nodes")
    assert bringup.needs(distenv.resolve(PER_NODE)) == ("master_addr", "node_rank", "num_nodes")


def test_the_service_is_asked_only_for_what_is_unknown(asked):
    known = distenv.resolve(recorded("openmpi4-np4", 1))
    assert bringup.completed(known) is known and asked == []  # nothing to ask
    single = distenv.resolve({})
    assert bringup.completed(single, nodes=True) is single and asked == []
    across = distenv.resolve(recorded("cluster-mpich4-2x2", 1))  # Hydra: no head node
    assert across.master_addr is None
    assert bringup.completed(across, timeout=7.0).master_addr == "node1"
    # MPICH gives no job id: every rank's host too, whose answer gives the job its own port
    assert asked == [(("master_addr", "world_size", "rank_hosts"), 7.0)]
    asked.clear()
    one_node = distenv.resolve(recorded("mpich4-np4", 1))  # every field known, the port torch's
    bringup.completed(one_node)
    assert asked == [(("master_addr", "world_size", "rank_hosts"), None)]


def test_a_mapping_passed_in_is_not_completed_unless_asked(asked, registered):
    environ = dict(recorded("cluster-mpich4-2x2", 1))
    env = bringup.bring_up("x", environ=environ, export=bringup.NEVER)
    assert env.master_addr is None and asked == []  # not this process's own launch
    env = bringup.bring_up("x", environ=environ, complete=True, export=bringup.NEVER)
    assert env.master_addr == "node1" and len(asked) == 1


def test_export_and_teardown_policies(registered, monkeypatch):
    launch = dict(recorded("openmpi4-np2", 1))
    for policy, wrote in ((bringup.ALWAYS, True), (bringup.DISTRIBUTED, True), (bringup.NEVER, False)):
        target = {}
        bringup.bring_up("x", environ=dict(launch), target=target, export=policy, teardown=policy)
        assert ("RANK" in target) is wrote and target.get("RANK") in (None, "1")
    assert len(registered) == 2
    registered.clear()
    single = {}
    bringup.bring_up("x", environ=single, export=bringup.DISTRIBUTED, teardown=bringup.DISTRIBUTED)
    assert single == {} and registered == []
    bringup.bring_up("x", environ=single, export=bringup.ALWAYS, teardown=bringup.ALWAYS)
    assert single["RANK"] == "0" and registered == [1]
    # the zero-code path writes torch's variables only where the launch's source lets torch act
    from distenv import sources

    monkeypatch.setattr(sources, "adapter_acts", lambda launcher, adapter: adapter != "torch")
    target = {}
    bringup.bring_up("auto", environ=dict(launch), target=target, export=bringup.ZERO_CODE,
                     teardown=bringup.NEVER)
    assert target == {}


def test_a_different_value_is_never_overwritten_unless_asked(registered):
    launch = {**recorded("openmpi4-np2", 1), "MASTER_PORT": "1234"}
    target = {"MASTER_PORT": "999"}
    with pytest.raises(DistEnvError, match="refusing to overwrite MASTER_PORT='999'"):
        bringup.bring_up("x", environ=launch, target=target)
    bringup.bring_up("x", environ=launch, target=target, overwrite=True)
    assert target["MASTER_PORT"] == "1234"


def test_every_caller_goes_through_the_bring_up():
    """No adapter or tool asks the launcher's service or exports on its own any more: the
    calls of distenv.discovery.complete are the bring-up's and the map's (its own need)."""
    import ast

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "distenv")
    callers = set()
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("discovery") \
                        and any(a.name == "complete" for a in node.names):
                    callers.add(os.path.relpath(path, root))
    assert callers == {"bringup/__init__.py", "nodemap.py"}, callers


# -- the master port, where rank 0 can look (issue 32 item 5) ----------------------------------
def _holding(port):
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    return s


def test_rank_0_stops_when_the_derived_master_port_is_taken_here(monkeypatch):
    """Another job (or program) listening on the port distenv derived: rank 0 says so, with a
    free port to set, instead of torch's bare "address already in use" or meeting that job."""
    monkeypatch.setattr(bringup, "_checked", set())
    env0 = ompi4(0, 2, 0, 2, 1)
    port = distenv.resolve(env0).master_port
    assert distenv.resolve(env0).provenance["master_port"].startswith("derived")
    holder = _holding(port)
    try:
        with pytest.raises(DistEnvError, match=rf"the master port {port} .* already in use on rank "
                                               r"0's host.*Fix: set MASTER_PORT to a free port "
                                               r"\(e\.g\. MASTER_PORT=\d+\) for every rank"):
            bringup.bring_up("torch", environ=env0, complete=True, export=bringup.NEVER,
                             teardown=bringup.NEVER)
        # not rank 0; a port the user gave; a framework that meets on ports of its own: no look
        for env, framework in ((ompi4(1, 2, 1, 2, 1), "torch"),
                               (dict(env0, MASTER_PORT=str(port)), "torch"), (env0, "jax")):
            got = bringup.bring_up(framework, environ=env, complete=True, export=bringup.NEVER,
                                   teardown=bringup.NEVER)
            assert got.master_port == port
    finally:
        holder.close()
    monkeypatch.setattr(bringup, "_checked", set())
    assert bringup.bring_up("torch", environ=env0, complete=True, export=bringup.NEVER,
                            teardown=bringup.NEVER).master_port == port  # free again: fine


def test_a_misspelled_knob_is_warned_about_once_from_rank_0(monkeypatch, caplog):
    """An adapter's start (the bring-up) names the knob a misspelled DISTENV_* name is nearest
    to, once per process, on rank 0 only (issue 29 item 2)."""
    from distenv import log

    for rank, lines in ((0, 1), (1, 0)):
        monkeypatch.setattr(log, "_warned", False)
        for k in list(os.environ):
            if k.startswith(("OMPI_", "DISTENV_")):
                monkeypatch.delenv(k)
        for k, v in {**ompi4(rank, 2, rank, 2, 1), "DISTENV_NPROC_PER_NOD": "2"}.items():
            monkeypatch.setenv(k, v)
        caplog.clear()
        with caplog.at_level("WARNING", logger="distenv"):
            for _ in range(2):
                bringup.bring_up("jax", export=bringup.NEVER, teardown=bringup.NEVER)
        said = [r.getMessage() for r in caplog.records if "DISTENV_NPROC_PER_NOD " in r.getMessage()]
        assert len(said) == lines, said
        assert all("did you mean DISTENV_NPROC_PER_NODE?" in m for m in said)


# -- a master address set by hand must be rank 0's host (issue 42, item 4; issue 39, item 4) -----
def _by_rank(name):
    from envs import ranks

    return sorted(ranks(name), key=lambda e: int(e["SLURM_PROCID"]))


def test_a_hand_set_master_address_naming_another_node_of_the_placement_is_an_error():
    """srun -N2 -n4 block: rank 0 runs on node1, as distenv's own placement says; MASTER_ADDR=node2
    (given by hand) used to pass, and torch's store then waited on node2, where nothing listens."""
    for env in _by_rank("cluster-srun-2x2"):
        e = distenv.resolve({**env, "MASTER_ADDR": "node2", "MASTER_PORT": "29999"})
        assert e.rank_hosts[0] == "node1"
        with pytest.raises(DistEnvError, match="master_addr=node2 .* rank 0 runs on node1"):
            bringup.completed(e)
        for fine in ("node1", "node1-ib", "10.0.0.7"):  # rank 0's host, or a name not provably another
            got = bringup.completed(distenv.resolve({**env, "MASTER_ADDR": fine}))
            assert got.master_addr == fine


def test_discovery_refuses_a_hand_set_master_address_that_is_another_ranks_host():
    """The pyxis PyTorch hook's MASTER_ADDR is the step's first node; under an arbitrary layout
    rank 0 runs on the other (recorded: srun --mpi=pmi2 -w node2,node1,node1,node2)."""
    from distenv.discovery import from_hostnames

    envs = _by_rank("cluster-srun-pmi2-n4-arbitrary")
    hosts = ["node2", "node1", "node1", "node2"]
    for env in envs:
        hooked = {**env, "RANK": env["SLURM_PROCID"], "LOCAL_RANK": env["SLURM_LOCALID"],
                  "WORLD_SIZE": env["SLURM_NTASKS"], "MASTER_ADDR": "node1", "MASTER_PORT": "62000"}
        e = distenv.resolve(hooked)
        assert e.rank_hosts is None and e.master_addr == "node1"  # pure resolve cannot know
        with pytest.raises(DistEnvError, match="rank 0 runs on node2"):
            from_hostnames(e, hosts, "PMI-1 key-value exchange")
        assert from_hostnames(distenv.resolve({**hooked, "MASTER_ADDR": "node2"}), hosts,
                              "PMI-1").master_addr == "node2"


@pytest.fixture
def names(monkeypatch):
    """Name lookups answered from a table (the real ones: tests/integration/test_master_elsewhere.py,
    the namespace nodes' addresses); a name mapped to None hangs."""
    import socket
    import time

    table = {"node1": ["10.0.0.1", "127.0.1.1"], "node2": ["10.0.0.2"], "node2.cluster": ["10.0.0.2"],
             "10.0.0.1": ["10.0.0.1"], "10.0.0.2": ["10.0.0.2"], "node1-ib": ["192.168.0.1"],
             "svc.default": ["10.96.0.10"], "slow": None}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if table[host] is None:
            time.sleep(5)
            raise socket.gaierror(socket.EAI_AGAIN, "late")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in table[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def test_an_address_of_another_node_is_refused_as_its_name_is(names, monkeypatch):
    """srun -N2 -n4 block, rank 0 on node1: MASTER_ADDR=10.0.0.2 (node2's address) or another
    name of node2 is an error naming node2; rank 0's address, an alias that resolves to no host
    of the job (InfiniBand), a Kubernetes service address, a name nobody resolves, and a lookup
    that does not answer within LOOKUP_SECONDS prove nothing and pass."""
    import time

    from distenv.core import placement

    monkeypatch.setattr(placement, "LOOKUP_SECONDS", 0.5)
    env = _by_rank("cluster-srun-2x2")[1]
    for wrong in ("10.0.0.2", "node2.cluster"):
        with pytest.raises(DistEnvError) as err:
            bringup.completed(distenv.resolve({**env, "MASTER_ADDR": wrong}))
        assert f"master_addr={wrong} (" in str(err.value) and "is an address of node2, another host " \
               "of the job, but rank 0 runs on node1" in str(err.value) and "\n" not in str(err.value)
    for fine in ("10.0.0.1", "node1-ib", "svc.default", "unknown-name", "slow"):
        start = time.monotonic()
        assert bringup.completed(distenv.resolve({**env, "MASTER_ADDR": fine})).master_addr == fine
        assert time.monotonic() - start < 2.0, fine
    del names["node1"]  # rank 0's own addresses unknown: nothing proven
    assert bringup.completed(distenv.resolve({**env, "MASTER_ADDR": "10.0.0.2"})).master_addr == "10.0.0.2"


def test_a_per_node_launch_refuses_a_master_given_on_another_node_than_node_0():
    """srun -N2 --ntasks-per-node=1 with DISTENV_NPROC_PER_NODE=2 (distenv run, Lightning start
    the workers): worker 0 runs on node 0 (node1), whose torchrun binds the master port; a
    MASTER_ADDR naming node2 made both torchruns wait there. Node 0's host passes."""
    from envs import slurm

    for rank in (0, 1):
        env = {**slurm(rank, nodelist="node[1-2]", tasks="1(x2)", ntasks=2, nnodes=2, nodeid=rank,
                       localid=0), "DISTENV_NPROC_PER_NODE": "2"}
        with pytest.raises(DistEnvError, match=r"master_addr=node2 .* rank 0 runs on node1"):
            bringup.completed(distenv.resolve({**env, "MASTER_ADDR": "node2"}))
        assert bringup.completed(distenv.resolve({**env, "MASTER_ADDR": "node1"})).master_addr == "node1"


# -- rank 0's own look at the master address (distenv.bringup.master; the two-node cases, refused,
# answered by another program, forwarded, are in tests/integration/test_master_elsewhere.py) ----
def _outbound_address():
    """This host's address toward the network (a UDP socket's local end: nothing is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def _free_port():
    from distenv.core.ports import free

    return free(20000 + os.getpid() % 9000)


def _rank_0(addr, port):
    return distenv.resolve({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": addr,
                            "MASTER_PORT": str(port)})


def test_rank_0_dials_its_own_listener_and_finds_itself():
    from distenv.bringup import master

    port = _free_port()
    assert master._dial(["127.0.0.1"], port) == ["here"]
    holder = _holding(port)  # the port held here (torchrun's agent's store): nothing to compare
    try:
        assert master._listen(port) == [] and master._dial(["127.0.0.1"], port) == []
    finally:
        holder.close()
    assert master._listen(port), "the dial left the port taken (TIME_WAIT or a listener)"
    for s in master._listen(port):
        s.close()


def test_an_own_address_another_name_or_a_name_that_proves_nothing_passes(monkeypatch):
    """This host's own address (bound, not dialed), its name, loopback, a name that does not
    resolve, an unreachable network: no error; the port may even be held by another program."""
    import socket

    from distenv.bringup import master

    monkeypatch.setenv("DISTENV_MASTER_CHECK", "1")
    port = _free_port()
    holder = _holding(port)
    try:
        given = [socket.gethostname(), "localhost", "127.0.0.1", "nosuch.invalid", "198.51.100.7"]
        own = _outbound_address()
        if own is not None:
            assert master._own(own)
            given.append(own)
        for addr in given:
            monkeypatch.setattr(master, "_checked", set())
            master.is_rank_0s(_rank_0(addr, port))  # returns
    finally:
        holder.close()
    assert not master._own("198.51.100.7")


def test_only_rank_0_looks_and_only_once(monkeypatch, caplog):
    """Another rank, a one-process run, DISTENV_MASTER_CHECK=0, or a second bring-up of the same
    address: no dial. Rank 0's look warns, in one line naming both, and never stops the job."""
    import logging
    import re

    from distenv.bringup import master

    dialed = []
    monkeypatch.setattr(master, "_dial", lambda addresses, port: dialed.append(addresses) or ["refused"])
    monkeypatch.setattr(master, "_checked", set())
    monkeypatch.setattr(master, "_own", lambda address: False)
    port = _free_port()
    master.is_rank_0s(distenv.resolve({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "192.0.2.77",
                                       "MASTER_PORT": str(port)}))
    master.is_rank_0s(distenv.resolve({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "192.0.2.77",
                                       "MASTER_PORT": str(port)}))
    master.is_rank_0s(_rank_0("192.0.2.77", port))  # the unit tests' default: off
    assert dialed == []
    monkeypatch.setenv("DISTENV_MASTER_CHECK", "1")
    with caplog.at_level(logging.WARNING, logger="distenv"):
        master.is_rank_0s(_rank_0("192.0.2.77", port))
        master.is_rank_0s(_rank_0("192.0.2.77", port))  # once per address and port
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and re.fullmatch(
        r"master_addr=192\.0\.2\.77 \(MASTER_ADDR\) is none of the addresses of .*, where rank 0 "
        r"runs, and 192\.0\.2\.77:\d+ dialed from there refused the connection: .* Fix: [^\n]*"
        r"DISTENV_MASTER_CHECK=0 silences this\.", said[0]), said
    assert dialed == [["192.0.2.77"]]
    monkeypatch.setattr(master, "_checked", set())
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_USE_AGENT_STORE": "True",
                "MASTER_ADDR": "192.0.2.77", "MASTER_PORT": str(port)}
    assert distenv.resolve(torchrun).launcher == "torchrun"
    master.is_rank_0s(distenv.resolve(torchrun))  # its agent's store, on a host rank 0 need not share
    assert dialed == [["192.0.2.77"]]


def test_a_refusal_or_another_program_is_a_warning_never_an_error(monkeypatch, caplog):
    """A forwarder whose backend is not ready answers so too (a Kubernetes service without
    endpoints or an LVS address refuses, on this host's network or beyond; a proxy accepts and
    closes), and the backend is rank 0's store, not yet listening: rank 0 warns, naming both,
    and goes on; an address that does not answer, or the token coming back, says nothing."""
    import logging

    from distenv.bringup import master

    monkeypatch.setenv("DISTENV_MASTER_CHECK", "1")
    monkeypatch.setattr(master, "_own", lambda address: False)
    for outcomes, warned in ((["refused"], "refused the connection"),
                             (["other"], "is answered by another program"),
                             (["refused", "other"], "is answered by another program"),
                             (["refused", "unknown"], None), (["here"], None), ([], None)):
        monkeypatch.setattr(master, "_dial", lambda addresses, port: outcomes)
        monkeypatch.setattr(master, "_checked", set())
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="distenv"):
            master.is_rank_0s(_rank_0("192.0.2.77", _free_port()))
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if warned is None:
            assert said == [], (outcomes, said)
        else:
            assert len(said) == 1 and said[0].startswith("master_addr=192.0.2.77 (MASTER_ADDR) is none "
                                                         "of the addresses of ") \
                and warned in said[0] and "Fix:" in said[0], (outcomes, said)


def test_multicast_and_broadcast_addresses_are_not_this_hosts_own():
    """Linux lets a TCP socket bind them, yet no client connects there (found in review)."""
    from distenv.bringup import master

    for address in ("224.0.0.1", "239.1.2.3", "255.255.255.255", "ff02::1"):
        assert not master._own(address), address


def test_a_name_with_more_addresses_than_are_dialed_proves_nothing(monkeypatch):
    """Any one of a service name's many addresses may be the one a client reaches: beyond
    DIALED, no dial at all (a name of a few: each dialed)."""
    from distenv.bringup import master
    from distenv.core import placement

    monkeypatch.setenv("DISTENV_MASTER_CHECK", "1")
    monkeypatch.setattr(master, "_own", lambda address: False)
    for count in (master.DIALED + 1, master.DIALED, 2):
        dialed = []
        monkeypatch.setattr(master, "_dial", lambda addresses, port: dialed.append(addresses) or ["refused"])
        many = frozenset(f"192.0.2.{i}" for i in range(1, count + 1))
        monkeypatch.setattr(placement, "_addresses", lambda names: {names[0]: many})
        monkeypatch.setattr(master, "_checked", set())
        master.is_rank_0s(_rank_0("svc.example", _free_port()))
        assert dialed == ([] if count > master.DIALED else [sorted(many)]), (count, dialed)


def test_every_dial_together_is_bounded_by_one_deadline(monkeypatch):
    """Addresses where another program takes the connection and the token never comes back
    (each dial would use its connect and its token's wait): every dial together, the token's
    wait included, ends within DIAL_SECONDS; past it nothing more is dialed."""
    import socket
    import time

    from distenv.bringup import master

    other = socket.socket()  # "another program" at the dialed port
    other.bind(("127.0.0.1", 0))
    other.listen(32)
    watched = socket.socket()  # rank 0's listener, at a port the dials never reach
    watched.bind(("127.0.0.1", 0))
    watched.listen(8)
    watched.setblocking(False)
    monkeypatch.setattr(master, "DIAL_SECONDS", 0.5)
    monkeypatch.setattr(master, "REACH_SECONDS", 0.2)
    monkeypatch.setattr(master, "_listen", lambda port: [watched])
    try:
        t0 = time.monotonic()
        out = master._dial(["127.0.0.1"] * 8, other.getsockname()[1])
        took = time.monotonic() - t0
    finally:
        other.close()
    assert took < 0.5 + 0.1, (took, out)
    assert out[:2] == ["other"] * 2 and set(out[2:]) <= {"other", "unknown"} and len(out) <= 4, out
