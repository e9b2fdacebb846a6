"""Placement math stays linear at 50 000 ranks (issue 32, item 3): every rank computes it at
start, so a quadratic step (list membership, list.index in a loop) cost 6.3 s at 50 000 ranks
(`from_hostnames` before: measured) and 4.1 s for a 50 000-line node file. Each case here is
timed as the least CPU time of three runs (other load on the machine does not count) and
must stay within 50 ms on this 2-core machine."""
from __future__ import annotations

import importlib.util
import os

import pytest

from distenv import resolve
from distenv.discovery.apply import from_hostnames
from distenv.nodemap import build
from distenv.core.placement import parse_hostfile

RANKS, PER_NODE = 50_000, 8
NODES = RANKS // PER_NODE
HOSTS = [f"nid{n:06d}.cluster.example.org" for n in range(NODES)]
LAYOUTS = {"block": [HOSTS[r // PER_NODE] for r in range(RANKS)],
           "cyclic": [HOSTS[r % NODES] for r in range(RANKS)]}
LIMIT = 0.050


def _bench():
    """benchmarks/bench_scale.py, whose `best` (least CPU time of 3 runs, no garbage
    collection inside) times the same cases with the same goal."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_scale.py")
    spec = importlib.util.spec_from_file_location("distenv_bench_scale", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


best = _bench().best


def mpich(rank: int) -> dict:
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(RANKS), "MPI_LOCALRANKID": "0",
            "MPI_LOCALNRANKS": str(PER_NODE)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_from_hostnames_at_50000_ranks(layout):
    names = LAYOUTS[layout]
    env = resolve(mpich(RANKS - 1))
    got = from_hostnames(env, names, "test")
    assert got.num_nodes == NODES and got.node_rank == HOSTS.index(names[-1])
    seconds = best(lambda: from_hostnames(env, names, "test"))
    assert seconds <= LIMIT, f"{seconds * 1e3:.1f} ms for {RANKS} ranks ({layout})"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_placement_map_at_50000_ranks(layout):
    names = LAYOUTS[layout]
    env = from_hostnames(resolve(mpich(0)), names, "test")
    table = build(env)
    assert len(table.nodes) == NODES
    seconds = best(lambda: build(env))
    assert seconds <= LIMIT, f"{seconds * 1e3:.1f} ms for {RANKS} ranks ({layout})"


def test_a_50000_line_node_file():
    """PBS_NODEFILE style: one line per slot (4.1 s before: list membership per line)."""
    text = "\n".join(LAYOUTS["block"]) + "\n"
    hosts, counts = parse_hostfile(text)
    assert hosts == HOSTS and set(counts) == {PER_NODE}
    seconds = best(lambda: parse_hostfile(text))
    assert seconds <= LIMIT, f"{seconds * 1e3:.1f} ms for {RANKS} lines"
