"""The resolver on horovodrun's Gloo-mode environment (src/distenv/sources/horovodrun.py)."""

from distenv import resolve
from distenv.core.ports import port_for


def test_horovodrun_gloo():
    env = resolve({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
                   "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.9", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4000"})
    assert env.launcher == "horovodrun" and env.master_addr == "127.0.0.1"
    assert env.master_port == port_for("horovod:10.0.0.9:4000")
