"""`distenv doctor` and `distenv.core.redact`: secrets never printed, misconfigurations flagged.

Everything the doctor reads from the machine goes through module attributes
(INFINIBAND_DIR, NET_DEV, NET_ROUTE, HOSTS_FILE, gpus.NVIDIA_DIR) that these tests point at
files they write, so the checks are exercised on planted hardware and networks.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from distenv import doctor, knobs
from distenv.cli import main as cli_main
from distenv.core.redact import MASK, is_secret_name, redact_environ, redact_text, redact_value
from envs import hydra_rank, ompi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One planted secret per pattern the issue names (and a few more), each value unique so a
# leak anywhere in the output is found by substring search.
SECRET_VARS = {
    "AZUREML_RUN_TOKEN": "azml-run-token-7f3a9c",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-K7MDENG-bPxRfiCY",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SESSION_TOKEN": "aws-session-token-c0ffee",
    "AWS_REGION": "eu-west-3-planted",
    "GITLAB_TOKEN": "gitlab-token-123abc",
    "SM_HP_SERVICE_TOKEN": "sm-hp-token-5e5e5e",
    "AZ_BATCH_AUTHENTICATION_TOKEN": "batch-auth-token-42",
    "NCCL_PLUGIN_KEY": "nccl-plugin-key-zz9",
    "OPENAI_API_KEY": "sk-planted0000000000000000000000",
    "CLIENT_SECRET": "client-secret-value-77",
    "AZURE_CLIENT_SECRET": "azure-client-secret-88",
    "DB_PASSWORD": "db-password-hunter2",
    "MYPASSWORDFILE": "password-in-name-middle",
    "PGPASSWORD": "pg-password-555",
    "HF_TOKEN": "hf_plantedplantedplantedplanted12",
    "HUGGING_FACE_HUB_TOKEN": "hf_anotherplantedtokenvalue0000",
    "WANDB_API_KEY": "wandb-api-key-0123456789abcdef",
    "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp-credentials-file.json",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pw-31337",
    "SM_HP_DB_PASSWD": "passwd-value-123",
    "SM_HP_AUTH": "sm-hp-auth-value-31",  # AUTH: a secret word (issue 30, item 8)
}
# Secrets inside values of variables that are not secret by name (URLs, JSON, tokens).
SECRET_IN_VALUES = {
    "SLURM_JOB_COMMENT": ("https://alice:url-password-xyz@git.example.org/repo.git", "url-password-xyz"),
    "SM_TRAINING_ENV": (json.dumps({"hyperparameters": {"hf_token": "json-nested-secret-1",
                                                        "lr": 0.1}}), "json-nested-secret-1"),
    "PET_RDZV_ENDPOINT": ("redis://:redis-pass-987@10.0.0.5:6379", "redis-pass-987"),
    "AZ_BATCH_JOB_URL": ("https://acct.blob.core.windows.net/c/b?sv=2021&sig=sas-signature-abc%3D&se=1",
                         "sas-signature-abc"),
    "SM_HP_ARGS": ("--hf_token=cli-token-value-42 --lr 0.1", "cli-token-value-42"),
    "TORCH_DISTRIBUTED_INIT": ("Authorization: Bearer bearer-token-value-xyz", "bearer-token-value-xyz"),
    "SM_HP_NOTE": ("ghp_plantedgithubtoken000000000000000", "ghp_plantedgithubtoken000000000000000"),
    "SM_HP_JWT": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.c2lnbmF0dXJl", "eyJzdWIiOiJwbGFudGVkIn0"),
    # issue 30, item 8: a JSON key ending in _auth; compact JSON ("key":"value", no space), where
    # the key's closing quote stood between the key and the ':' the pattern expected
    "SM_HPS": (json.dumps({"hf_auth": "json-hf-auth-32", "lr": 0.1}), "json-hf-auth-32"),
    "SM_USER_ARGS": (json.dumps({"auth": "json-auth-33", "epochs": 1}, separators=(",", ":")),
                     "json-auth-33"),
    "SM_INPUT_DATA_CONFIG": ('{"train":{"sig":"json-sig-34","mode":"File"}}', "json-sig-34"),
}
NOT_SECRET = ("OMPI_COMM_WORLD_RANK", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "NCCL_IB_DISABLE",
              "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD", "SSH_AUTH_SOCK", "KEYTIMEOUT", "MONKEY_BUSINESS",
              "LOCAL_RANK", "UCX_TLS")

OMPI_2X2 = ompi(0, 4, 0, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="2",
                OMPI_MCA_orte_hnp_uri="2197356545.0;tcp://10.213.77.11:41231",
                OMPI_MCA_ess_base_jobid="2197356545")
OMPI_1X2 = ompi(1, 2, 1, 2, node_rank_trap=False, OMPI_MCA_orte_num_nodes="1",
                OMPI_MCA_orte_hnp_uri="2197356546.0;tcp://10.213.77.11:41232",
                OMPI_MCA_ess_base_jobid="2197356546")


# -- the machine, planted ------------------------------------------------------------------
@pytest.fixture
def machine(tmp_path, monkeypatch, no_gpus):
    """A controlled machine: no RDMA device, interfaces lo + eth0 + ib0, a route table,
    /etc/hosts mapping this host to a routable address. Returns helpers to change it."""
    ib = tmp_path / "infiniband"
    netdev = tmp_path / "net_dev"
    netdev.write_text(
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes ...\n"
        "    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
        "  eth0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
        "   ib0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
    route = tmp_path / "route"
    # default via eth0; 10.213.77.0/24 on ib0 (little-endian hex, as the kernel writes it)
    route.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "ib0\t004DD50A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n10.213.77.11 node1\n10.213.77.12 {os.uname().nodename}\n")
    monkeypatch.setattr(doctor.system, "INFINIBAND_DIR", str(ib))
    monkeypatch.setattr(doctor.system, "NET_DEV", str(netdev))
    monkeypatch.setattr(doctor.system, "NET_ROUTE", str(route))
    monkeypatch.setattr(doctor.system, "HOSTS_FILE", str(hosts))
    monkeypatch.setattr(knobs, "bound_cores", lambda: 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)

    class Machine:
        def rdma(self, name="mlx5_0", state="4: ACTIVE", layer="InfiniBand", port="1"):
            d = ib / name / "ports" / port
            d.mkdir(parents=True, exist_ok=True)
            (d / "state").write_text(state + "\n")
            (d / "link_layer").write_text(layer + "\n")

        hosts_file = hosts

    return Machine()


def findings(report, topic=None, level=None):
    return [f for f in report["findings"] if (topic is None or f["topic"] == topic)
            and (level is None or f["level"] == level)]


def text_of(report):
    return json.dumps(report) + "\n" + doctor.render(report)


# -- redaction -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SECRET_VARS))
def test_secret_names_are_recognised_and_masked(name):
    assert is_secret_name(name)
    assert redact_value(name, SECRET_VARS[name]) == MASK
    # In free text (an error message, a log line), in every quoting style.
    for text in (f"{name}={SECRET_VARS[name]}", f"{name}='{SECRET_VARS[name]}'",
                 f'{name}="{SECRET_VARS[name]}"', f'{{"{name.lower()}": "{SECRET_VARS[name]}"}}'):
        assert SECRET_VARS[name] not in redact_text(text), text


@pytest.mark.parametrize("name", NOT_SECRET)
def test_ordinary_names_are_shown(name):
    assert not is_secret_name(name)
    assert redact_value(name, "/some/value-42") == "/some/value-42"


@pytest.mark.parametrize("name", sorted(SECRET_IN_VALUES))
def test_secrets_inside_values_are_scrubbed(name):
    value, secret = SECRET_IN_VALUES[name]
    shown = redact_value(name, value)
    assert secret not in shown and MASK in shown
    assert secret not in redact_text(f"{name}={value!r} is wrong")


def test_auth_in_sagemakers_training_env_is_redacted_and_the_rest_kept():
    """Issue 30, item 8: SM_TRAINING_ENV (JSON, compact or not) with an "auth" key and a
    hyperparameter "hf_auth": both values masked, every other key and value kept."""
    for separators in ((", ", ": "), (",", ":")):
        value = json.dumps({"hyperparameters": {"hf_auth": "hf-auth-35", "lr": 0.1},
                            "auth": "auth-36", "current_host": "algo-1"}, separators=separators)
        shown = redact_value("SM_TRAINING_ENV", value)
        assert "hf-auth-35" not in shown and "auth-36" not in shown, shown
        assert json.loads(shown) == {"hyperparameters": {"hf_auth": MASK, "lr": 0.1},
                                     "auth": MASK, "current_host": "algo-1"}, shown


def test_scrub_keeps_the_rest_of_the_value():
    assert redact_text("https://alice:pw@host:8080/x") == f"https://alice:{MASK}@host:8080/x"
    assert redact_text("MASTER_ADDR='https://me:pw@host' bad") == f"MASTER_ADDR='https://me:{MASK}@host' bad"
    uri = "2197356545.0;tcp://10.0.0.1,10.1.0.1:41231"  # Open MPI URIs are not credentials
    assert redact_text(uri) == uri
    assert redact_text("PMIX_SERVER_URI41=prterun-n1-12@0.0;tcp4://10.2.0.1:4") == \
        "PMIX_SERVER_URI41=prterun-n1-12@0.0;tcp4://10.2.0.1:4"
    assert redact_environ({"HF_TOKEN": "x", "RANK": "1"}) == {"HF_TOKEN": MASK, "RANK": "1"}


def test_doctor_never_prints_a_planted_secret(machine, capsys, monkeypatch):
    environ = {**OMPI_2X2, **SECRET_VARS, **{k: v for k, (v, _) in SECRET_IN_VALUES.items()}}
    report = doctor.diagnose(environ, probe=False)
    out = text_of(report)
    for secret in list(SECRET_VARS.values()) + [s for _, s in SECRET_IN_VALUES.values()]:
        assert secret not in out, secret
    # The variables are listed (so the user sees they are set), their values masked.
    assert report["environment"]["AZUREML_RUN_TOKEN"] == MASK
    assert report["environment"]["AWS_SECRET_ACCESS_KEY"] == MASK
    assert report["environment"]["OMPI_COMM_WORLD_SIZE"] == "4"
    # Same through the command line, text and JSON.
    monkeypatch.setattr(os, "environ", dict(environ))
    for argv in (["doctor"], ["doctor", "--json"]):
        cli_main(argv)
        printed = capsys.readouterr()
        for secret in list(SECRET_VARS.values()) + [s for _, s in SECRET_IN_VALUES.values()]:
            assert secret not in printed.out + printed.err, (argv, secret)


def test_errors_are_redacted_too(machine, capsys, monkeypatch):
    token = "hf_leakedleakedleakedleaked0123"
    monkeypatch.setattr(os, "environ", {"OMPI_COMM_WORLD_RANK": token, "OMPI_COMM_WORLD_SIZE": "2"})
    assert cli_main(["show"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("distenv: error: OMPI_COMM_WORLD_RANK=") and token not in err
    report = doctor.diagnose(dict(os.environ))
    assert report["status"] == "error" and token not in text_of(report)
    assert "OMPI_COMM_WORLD_RANK" in report["error"]


# -- planted misconfigurations ---------------------------------------------------------------
def test_nccl_ib_disable_with_an_rdma_device_is_flagged(machine):
    machine.rdma("mlx5_0", "4: ACTIVE", "InfiniBand")
    report = doctor.diagnose({**OMPI_2X2, "NCCL_IB_DISABLE": "1"})
    flagged = [f for f in findings(report, "network", "warning") if "NCCL_IB_DISABLE=1" in f["message"]]
    assert len(flagged) == 1, report["findings"]
    assert "mlx5_0" in flagged[0]["message"] and "unset NCCL_IB_DISABLE" in flagged[0]["fix"]
    assert report["network"]["rdma_devices"][0]["ports"][0] == \
        {"port": "1", "state": "ACTIVE", "link_layer": "InfiniBand"}
    assert "NCCL_IB_DISABLE=1" in doctor.render(report)


@pytest.mark.parametrize("case", ["no device", "port down", "not disabled", "disable=0"])
def test_nccl_ib_disable_not_flagged_when_right(machine, case):
    environ = {**OMPI_2X2, "NCCL_IB_DISABLE": "1"}
    if case == "port down":
        machine.rdma("mlx5_0", "1: DOWN")
    elif case == "not disabled":
        machine.rdma()
        del environ["NCCL_IB_DISABLE"]
    elif case == "disable=0":
        machine.rdma()
        environ["NCCL_IB_DISABLE"] = "0"
    report = doctor.diagnose(environ)
    assert not [f for f in report["findings"] if "NCCL_IB_DISABLE" in f["message"]]


def test_roce_device_counts_as_rdma(machine):
    machine.rdma("rocep1s0f0", "4: ACTIVE", "Ethernet")
    report = doctor.diagnose({**OMPI_2X2, "NCCL_IB_DISABLE": "1"})
    assert [f for f in findings(report, "network", "warning") if "rocep1s0f0" in f["message"]]


def test_nccl_ib_hca_and_ucx_against_present_devices(machine):
    machine.rdma("mlx5_0")
    report = doctor.diagnose({**OMPI_2X2, "NCCL_IB_HCA": "mlx4_", "UCX_NET_DEVICES": "mlx5_1:1",
                              "UCX_TLS": "tcp,self"})
    messages = " ".join(f["message"] for f in findings(report, "network", "warning"))
    assert "NCCL_IB_HCA=mlx4_ matches no RDMA device" in messages
    assert "UCX_NET_DEVICES=mlx5_1:1" in messages
    assert "UCX_TLS=tcp,self keeps UCX off" in messages
    ok = doctor.diagnose({**OMPI_2X2, "NCCL_IB_HCA": "mlx5", "UCX_NET_DEVICES": "mlx5_0:1,eth0",
                          "UCX_TLS": "rc,sm,self"})
    assert not findings(ok, "network", "warning")


def test_socket_ifname_checked_against_interfaces(machine):
    bad = doctor.diagnose({**OMPI_2X2, "NCCL_SOCKET_IFNAME": "enp9s0", "GLOO_SOCKET_IFNAME": "eth"})
    errors = {f["message"].split("=")[0] for f in findings(bad, "network", "error")}
    # NCCL matches prefixes (eth0 would match "eth"), gloo wants exact names.
    assert errors == {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}, bad["findings"]
    assert doctor.diagnose({**OMPI_2X2, "NCCL_SOCKET_IFNAME": "^lo,docker"})["status"] != "error"
    lo = doctor.diagnose({**OMPI_2X2, "GLOO_SOCKET_IFNAME": "lo"})
    assert any("loopback" in f["message"] for f in findings(lo, "network", "error"))
    good = doctor.diagnose({**OMPI_2X2, "NCCL_SOCKET_IFNAME": "=ib0", "GLOO_SOCKET_IFNAME": "ib0"})
    assert not findings(good, "network", "error")


def test_interface_that_reaches_rank0_is_suggested(machine):
    report = doctor.diagnose(OMPI_2X2)
    assert report["network"]["route_to_master"] == \
        {"address": "10.213.77.11", "interface": "ib0", "route": "10.213.77.0/24"}
    fix = [f["fix"] for f in findings(report, "network", "info") if f["fix"] and "ib0" in f["fix"]]
    assert fix and "NCCL_SOCKET_IFNAME=ib0" in fix[0] and "GLOO_SOCKET_IFNAME=ib0" in fix[0]


def test_hostname_on_loopback_is_flagged_for_gloo(machine):
    machine.hosts_file.write_text(f"127.0.1.1 {os.uname().nodename}\n")
    report = doctor.diagnose(OMPI_2X2)
    assert any("gloo binds" in f["message"] for f in findings(report, "network", "warning"))
    one_node = doctor.diagnose(OMPI_1X2)
    assert not any("gloo binds" in f["message"] for f in one_node["findings"])


@pytest.mark.parametrize("gpus, extra, level, text", [
    (1, {}, "error", "only 1 GPU(s) visible"),             # 2 processes share one GPU
    (4, {}, "warning", "2 GPU(s) idle"),
    (4, {"CUDA_VISIBLE_DEVICES": "1"}, "info", "sees 1 GPU"),  # narrowed per task
    (4, {"CUDA_VISIBLE_DEVICES": "0,1"}, "ok", "2 GPU(s) visible"),
])
def test_gpus_against_local_processes(machine, fake_gpus, gpus, extra, level, text):
    fake_gpus(gpus)
    report = doctor.diagnose({**OMPI_1X2, **extra})
    found = findings(report, "gpus")
    assert len(found) == 1 and found[0]["level"] == level and text in found[0]["message"], found


def test_cpu_oversubscription(machine, monkeypatch):
    unset = doctor.diagnose(OMPI_1X2)  # 2 processes x 8 cores each on 8 cores
    warn = findings(unset, "cpu", "warning")
    assert warn and "OMP_NUM_THREADS=4" in warn[0]["fix"]
    assert findings(doctor.diagnose({**OMPI_1X2, "OMP_NUM_THREADS": "4"}), "cpu", "ok")
    assert findings(doctor.diagnose({**OMPI_1X2, "OMP_NUM_THREADS": "6"}), "cpu", "warning")
    # Bound by the launcher to 1 core: threads beyond it compete.
    monkeypatch.setattr(knobs, "bound_cores", lambda: 1)
    bound = findings(doctor.diagnose({**OMPI_1X2, "OMP_NUM_THREADS": "4"}), "cpu", "warning")
    assert bound and "OMP_NUM_THREADS=1" in bound[0]["fix"]
    # A per-node launch whose workers would share the one core it is bound to.
    per_node = doctor.diagnose({**OMPI_2X2, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                                "DISTENV_NPROC_PER_NODE": "4", "OMP_NUM_THREADS": "1"})
    assert any("--bind-to none" in (f["fix"] or "") for f in findings(per_node, "cpu", "warning"))


def test_launch_checks(machine):
    loop = doctor.diagnose({**OMPI_2X2, "MASTER_ADDR": "127.0.0.1"})
    assert any("loopback" in f["message"] for f in findings(loop, "launch", "error"))
    mpich = hydra_rank(0, 4, 0, 2)
    report = doctor.diagnose(mpich)
    assert any("rank 0's address is unknown" in f["message"] for f in findings(report, "launch", "error"))
    assert any("torch's default" in f["message"] for f in findings(report, "launch", "warning"))
    per_node = doctor.diagnose({**OMPI_2X2, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                                "DISTENV_NPROC_PER_NODE": "2"})
    assert any("distenv run" in (f["fix"] or "") for f in findings(per_node, "launch", "info"))
    single = doctor.diagnose({})
    assert single["status"] == "ok" and single["launch"]["launcher"] == "none"


# -- probe ---------------------------------------------------------------------------------
def test_probe_reports_listening_and_refused(machine):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    environ = {**OMPI_1X2, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    try:
        listening = doctor.diagnose(environ, probe=True, timeout=2)
    finally:
        server.close()
    assert listening["probe"]["result"] == "listening"
    refused = doctor.diagnose(environ, probe=True, timeout=2)  # nothing there any more
    assert refused["probe"]["result"] == "refused" and findings(refused, "probe", "ok")


def test_no_socket_without_probe():
    """Without --probe the doctor opens no socket (checked with an audit hook)."""
    script = textwrap.dedent("""
        import sys
        events = []
        sys.addaudithook(lambda e, a: events.append(e) if e.startswith("socket.") else None)
        from distenv.cli import main
        rc = main(["doctor", "--json"])
        sys.stderr.write("SOCKET-EVENTS %r\\n" % events)
        sys.exit(rc)
    """)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.path.join(ROOT, "src"), **OMPI_2X2}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert "SOCKET-EVENTS []" in p.stderr, p.stderr
    report = json.loads(p.stdout)
    assert report["launch"]["world_size"] == 4 and "probe" not in report


def test_cli_exit_status_and_json_shape(machine, capsys, monkeypatch):
    monkeypatch.setattr(os, "environ", {**OMPI_1X2, "OMP_NUM_THREADS": "4"})
    # rank 1 has local rank 1: by default only local rank 0 of each node prints
    assert cli_main(["doctor", "--json"]) == 0 and capsys.readouterr().out == ""
    assert cli_main(["doctor", "--json", "--ranks", "all"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"launch", "provenance", "findings", "environment", "gpus", "cpu", "network",
                           "status"}
    assert all(set(f) == {"level", "topic", "message", "fix"} for f in report["findings"])
    monkeypatch.setattr(os, "environ", {**OMPI_2X2, "NCCL_SOCKET_IFNAME": "nope0"})
    assert cli_main(["doctor"]) == 1
    assert "[error] network: NCCL_SOCKET_IFNAME=nope0" in capsys.readouterr().out


# -- issue 23: what distenv leaves to a framework's own detection ---------------------------------
def test_doctor_says_the_zero_code_paths_leave_a_platform_the_framework_detects(machine):
    report = doctor.diagnose({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, probe=False)
    launch = [f for f in report["findings"] if f["topic"] == "launch"]
    assert any(f["level"] == "info" and "keeps its own answer" in f["message"] for f in launch), launch
    warned = [f for f in launch if f["level"] == "warning"]
    assert any("KUBERNETES_SERVICE_HOST" in f["message"] and f["fix"] for f in warned), launch


def test_doctor_names_the_only_adapters_acting_on_a_tpu_pod(machine):
    report = doctor.diagnose({"TPU_WORKER_HOSTNAMES": "w-0,w-1", "TPU_WORKER_ID": "0"}, probe=False)
    launch = [f["message"] for f in report["findings"] if f["topic"] == "launch"]
    assert any("only distenv's jax adapter" in m for m in launch), launch
    plain = doctor.diagnose({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, probe=False)
    assert not any("only distenv's" in f["message"] for f in plain["findings"])


# -- long findings (issue 30, item 12) -------------------------------------------------------------
def test_a_finding_is_printed_whole_or_says_where_it_is_whole(machine):
    """The no-launcher launch finding (316 characters) was cut at 120 with '... (316 chars)'
    and no way to read the rest; now findings print whole, and one longer than the limit says
    where the whole text is (the JSON report holds it)."""
    report = doctor.diagnose({}, probe=False)
    launch = next(f for f in findings(report, "launch") if f["level"] == "info")
    assert len(launch["message"]) > 200  # what was cut
    text = doctor.render(report)
    assert f"[info] launch: {launch['message']}\n" in text
    assert "chars)" not in text
    long = {**report, "findings": [{"level": "warning", "topic": "launch", "message": "w" * 2500,
                                    "fix": "f" * 2100}]}
    text = doctor.render(long)
    assert "  [warning] launch: " + "w" * 2000 + "... (2500 chars; the whole text: distenv doctor --json)" in text
    assert "      fix: " + "f" * 2000 + "... (2100 chars; the whole text: distenv doctor --json)" in text
    line = doctor.summary(long)
    assert "w" * 200 + "... (2500 chars; the whole text: distenv doctor)" in line and "\n" not in line


def test_the_launchers_version_comes_from_what_its_source_declares(monkeypatch):
    """The doctor keeps no table of launchers (issue 29, item 3): Open MPI's version variable,
    torchrun's distribution and Intel MPI's command are their Sources' declarations."""
    from distenv.doctor import versioninfo
    from distenv.sources import job_prefixes, source_of

    got = versioninfo.launcher_version("openmpi", {"OMPI_VERSION": "5.0.11"})
    assert got == {"version": "Open MPI 5.0.11", "source": "OMPI_VERSION"}
    assert versioninfo.launcher_version("torchrun", {})["source"].startswith("torch")
    assert source_of("intelmpi").doctor.command_for("intelmpi") == "mpiexec.hydra"
    assert source_of("mpich").doctor.command_for("mpich") == "mpiexec"
    seen = []
    monkeypatch.setattr(versioninfo, "_launcher_command",
                        lambda launcher, source: seen.append(source.doctor.command_for(launcher)))
    versioninfo.launcher_version("slurm", {})
    assert seen == ["srun"]
    assert {"OMPI_", "PMI_", "PRTE_"} <= set(job_prefixes())
    text = open(versioninfo.__file__).read()
    assert "mpirun" not in text and "OMPI_" not in text and "hydra_pmi_proxy" not in text
