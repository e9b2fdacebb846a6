"""Resolution is pure: no socket, no process, no file written, no framework imported,
and the environment mapping is left as it was. Checked with audit hooks in a fresh
interpreter, on a realistic launcher environment for each family."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from envs import ompi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    events = []
    WATCH = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
             "os.remove", "os.rename", "os.mkdir", "shutil.")
    def hook(event, args):
        if event.startswith(WATCH):
            events.append(event)
        elif event == "open" and len(args) > 1 and isinstance(args[1], str) and any(
                c in args[1] for c in "wax+"):
            events.append("open-for-write:" + str(args[0]))
    before = set(sys.modules)
    sys.addaudithook(hook)
    import distenv
    snapshot = dict(os.environ)
    env = distenv.resolve()
    env.explain(); env.to_dict()
    assert dict(os.environ) == snapshot, "resolve() changed os.environ"
    frameworks = sorted(m for m in set(sys.modules) - before
                        if m.split(".")[0] in ("torch", "lightning", "pytorch_lightning",
                                               "transformers", "accelerate", "deepspeed",
                                               "tensorflow", "keras", "horovod", "mpi4py", "numpy"))
    print(json.dumps({"events": events, "frameworks": frameworks, "launcher": env.launcher}))
    """
)

ENVS = {
    "none": {},
    "openmpi": ompi(1, 4, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2",
                    OMPI_MCA_orte_hnp_uri="7.0;tcp://10.0.0.1:5"),
    "slurm": {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2",
              "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
    "tf_config": {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                           "task": {"type": "worker", "index": 1}})},
    "sagemaker": {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "0"},
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_resolve_opens_no_socket_starts_no_process_writes_no_file(name):
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.path.join(ROOT, "src"),
           "PYTHONDONTWRITEBYTECODE": "1", **ENVS[name]}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["launcher"] != "" and report["events"] == [], report
    assert report["frameworks"] == []
