"""The resolver on LSF jsrun environments written from its documentation
(src/distenv/sources/lsf.py)."""
from distenv import resolve


def test_lsf_jsrun_one_node_uses_loopback():
    lsf = resolve({"JSM_NAMESPACE_RANK": "1", "JSM_NAMESPACE_SIZE": "2", "JSM_NAMESPACE_LOCAL_RANK": "1",
                   "JSM_NAMESPACE_LOCAL_SIZE": "2", "LSB_JOBID": "7"})
    assert (lsf.launcher, lsf.num_nodes, lsf.master_addr) == ("lsf", 1, "127.0.0.1")
