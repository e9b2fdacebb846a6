"""No planted secret is ever printed: `distenv show` (table, --json, --explain), `distenv
export`, `distenv doctor` (and --json), the one-line errors of the command line, the
`DistEnvError` raised by `resolve()` itself, and what `distenv.auto` (DISTENV_AUTO=1) and
`distenv run` write to stderr.

Secrets are planted two ways, each value unique so a leak is found by substring search:

* in variables that are secret by name (AZUREML_RUN_TOKEN, AWS_SECRET_ACCESS_KEY, HF_TOKEN,
  ...), next to a valid launch and next to a broken one;
* inside *bad values of variables distenv reads* (MASTER_ADDR='https://user:pass@host',
  RANK='hf_...', TF_CONFIG holding a URL with a password, ...), in a form that looks secret
  (URL credentials, token=..., well-known token formats): these end up in error messages.

The command line runs in-process for the whole matrix (fast) and in real subprocesses for a
sample, with DISTENV_AUTO=1 and `distenv run` too.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from distenv import DistEnvError, resolve
from distenv.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Secret by name.
SECRET_VARS = {
    "AZUREML_RUN_TOKEN": "eyJhbGciOiJSUzI1NiJ9.eyJydW4iOiJwbGFudGVkMSJ9.azmlsig0001",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-planted2-bPxRfiCY",
    "AWS_SESSION_TOKEN": "aws-session-planted3",
    "HF_TOKEN": "hf_planted4planted4planted4planted4",
    "WANDB_API_KEY": "wandb-planted5-0123456789abcdef",
    "AZ_BATCH_AUTHENTICATION_TOKEN": "batch-auth-planted6",
    "DB_PASSWORD": "db-password-planted7",
    "GITHUB_TOKEN": "ghp_planted8planted8planted8planted8pl",
    "SM_HP_AUTH": "sm-hp-auth-planted9",  # shown by doctor (a SageMaker variable); AUTH is secret
}

#: (variable distenv reads, bad value with a secret inside, the secret). Each is planted on
#: top of BASE (a valid torchrun-like launch) unless it names its own base.
BAD_VALUES = [
    ("MASTER_ADDR", "https://alice:pw-master-addr-11@10.0.0.1", "pw-master-addr-11"),
    ("MASTER_ADDR", "alice:pw-master-addr-12@10.0.0.1", "pw-master-addr-12"),
    ("MASTER_PORT", "https://bob:pw-master-port-13@h:29500", "pw-master-port-13"),
    ("MASTER_PORT", "token=pw-master-port-14", "pw-master-port-14"),
    ("RANK", "hf_pwRankPlanted15xxxxxxxxxxxxxxxxxxx", "hf_pwRankPlanted15xxxxxxxxxxxxxxxxxxx"),
    ("WORLD_SIZE", "ghp_pwWorldPlanted16xxxxxxxxxxxxxxxxxx", "ghp_pwWorldPlanted16xxxxxxxxxxxxxxxxxx"),
    ("DISTENV_LAUNCHER", "api_key=pw-launcher-17", "pw-launcher-17"),
    ("DISTENV_NPROC_PER_NODE", "password=pw-nproc-18", "pw-nproc-18"),
]
#: Bad values for sources with their own base environment: (id, environment, the secret).
BAD_IN_SOURCES = [
    ("tfconfig-url", {"TF_CONFIG": json.dumps({"cluster": {"worker": ["https://u:pw-tfconfig-21@a:1"]},
                                               "task": {"type": "worker", "index": 3}})},
     "pw-tfconfig-21"),
    ("tfconfig-type", {"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "token=pw-tfconfig-22"}'},
     "pw-tfconfig-22"),
    ("sm-hosts", {"SM_HOSTS": '["algo-1", "https://u:pw-smhosts-23@algo-2"', "SM_CURRENT_HOST": "algo-1"},
     "pw-smhosts-23"),
    ("slurm-nodelist", {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
                        "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                        "SLURM_STEP_NUM_NODES": "2",
                        "SLURM_STEP_NODELIST": "n[1-2],https://u:pw-nodelist-24@x[",
                        "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, "pw-nodelist-24"),
    ("ompi-rank", {"OMPI_COMM_WORLD_RANK": "sk-pwOmpiRank25xxxxxxxxxxxxxxxxxxxx",
                   "OMPI_COMM_WORLD_SIZE": "2"}, "sk-pwOmpiRank25xxxxxxxxxxxxxxxxxxxx"),
    ("ompi-hnp-uri", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                      "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                      "OMPI_MCA_orte_num_nodes": "2",
                      "OMPI_MCA_orte_hnp_uri": "7.0;tcp://u:pw-hnp-uri-26@10.0.0.1:5"}, "pw-hnp-uri-26"),
    ("azbatch-master", {"AZ_BATCH_MASTER_NODE": "u:pw-azbatch-27@10.0.0.4:6105", "AZUREML_RUN_ID": "r1",
                        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "pw-azbatch-27"),
    ("torchrun-run-id", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                         "GROUP_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                         "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                         "TORCHELASTIC_RUN_ID": "https://u:pw-run-id-29@x"}, "pw-run-id-29"),
    ("nccl-ifname", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                     "LOCAL_RANK": "x", "NCCL_SOCKET_IFNAME": "https://u:pw-nccl-28@eth0"}, "pw-nccl-28"),
]

BASE = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}

# -- known leaks: strict xfails (a fix makes them XPASS, which fails: drop the entry) ---------
_RAW_IN_ERROR = ("resolve()'s DistEnvError quotes the raw value (reading.show / !r); the CLI "
                 "scrubs its line, resolve() callers get the secret. Fix: errors.DistEnvError."
                 "__init__ runs the text through redact.scrub (lazy import)")
_ADDR = ("a master address holding user:password@ is accepted and printed as is. Fix: resolver."
         "_check_invariants refuses a master_addr that is not a host name or address (no '@', "
         "'/', ':' outside [IPv6]) -- then show/export exit 2 with the redacted line")
_NO_SCHEME = ("redact.scrub only hides credentials after scheme://; 'user:pass@host' and the "
              "hostlist error's fragment '//u:pass@x[' pass. Fix: a scrub pattern for "
              "[^\\s:/@'\"]+:[^\\s@/'\"]+@ without a scheme")
_JOB_ID = ("job_id (and hosts) are printed unredacted by show and doctor (doctor redacts only "
           "master_addr). Fix: cli._show and doctor.diagnose pass every string field, provenance "
           "and note through redact.redact_text")
ALL = ("show", "show --json", "show --explain", "export", "doctor", "doctor --json")
SHOWS = ("show", "show --json", "show --explain", "export")
#: case id -> {"resolve": reason} and/or {command: reason}
KNOWN_LEAKS: dict = {}  # all fixed: errors are scrubbed, addresses validated, show/doctor redact every field


def _cases():
    out = [("valid-launch", dict(BASE), list(SECRET_VARS.values())),
           ("broken-launch", {**BASE, "RANK": "7"}, list(SECRET_VARS.values()))]
    for var, value, secret in BAD_VALUES:
        out.append((f"bad-{var}-{''.join(c for c in secret if c.isdigit())[:2]}",
                    {**BASE, var: value}, [secret]))
    for name, env, secret in BAD_IN_SOURCES:
        out.append((name, env, [secret]))
    return out


CASES = _cases()
COMMANDS = [c.split() for c in ALL]


def _param(case_id, *values, what):
    reason = KNOWN_LEAKS.get(case_id, {}).get(what)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(*values, marks=marks, id=f"{case_id}-{what.replace(' ', '')}")


def _cli(argv, environ):
    out, err = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(list(argv))
    finally:
        os.environ.clear()
        os.environ.update(old)
    return code, out.getvalue(), err.getvalue()


def _leaks(text: str, secrets) -> list:
    return [s for s in secrets if s in text]


@pytest.mark.parametrize("env, secrets", [_param(i, e, s, what="resolve") for i, e, s in CASES])
def test_resolve_errors_never_hold_a_secret(no_gpus_session, env, secrets):
    environ = {**env, **SECRET_VARS}
    try:
        resolve(environ)
    except DistEnvError as exc:
        assert not _leaks(str(exc), secrets + list(SECRET_VARS.values())), str(exc)


@pytest.mark.parametrize("env, secrets, argv", [_param(i, e, s, argv, what=" ".join(argv))
                                                 for i, e, s in CASES for argv in COMMANDS])
def test_cli_never_prints_a_secret(no_gpus_session, env, secrets, argv):
    environ = {"PATH": os.environ.get("PATH", ""), **env, **SECRET_VARS}
    code, out, err = _cli(argv, environ)
    leaked = _leaks(out + err, secrets + list(SECRET_VARS.values()))
    assert not leaked, f"`distenv {' '.join(argv)}` (exit {code}) printed {leaked}:\n{out}{err}"


# -- real processes: the command line, DISTENV_AUTO=1 and `distenv run` ----------------------
def _run(argv, env, timeout=60):
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.path.join(ROOT, "src"),
            "PYTHONDONTWRITEBYTECODE": "1", **env, **SECRET_VARS}
    p = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


SAMPLE = ["valid-launch", "broken-launch", "bad-MASTER_ADDR-11", "bad-MASTER_PORT-13",
          "bad-RANK-15", "sm-hosts"]


@pytest.mark.parametrize("env, secrets", [
    _param(i, e, s, what="process" if i != "bad-MASTER_ADDR-11" else "show") for i, e, s in CASES
    if i in SAMPLE])
def test_processes_never_print_a_secret(env, secrets):
    secrets = secrets + list(SECRET_VARS.values())
    runs = {
        "distenv show --explain": [sys.executable, "-m", "distenv", "show", "--explain"],
        "distenv doctor": [sys.executable, "-m", "distenv", "doctor"],
        # distenv run: resolves, exports, execs the command (here: print nothing, exit 3)
        "distenv run": [sys.executable, "-m", "distenv", "run", "--", sys.executable, "-c",
                        "raise SystemExit(3)"],
    }
    for what, argv in runs.items():
        code, text = _run(argv, env)
        assert not _leaks(text, secrets), f"{what} (exit {code}) printed a secret:\n{text}"
    # DISTENV_AUTO=1: distenv.auto activates at interpreter start; an error ends it (exit 2)
    code, text = _run([sys.executable, "-c", "print('script ran')"], {**env, "DISTENV_AUTO": "1"})
    assert not _leaks(text, secrets), f"DISTENV_AUTO=1 (exit {code}) printed a secret:\n{text}"


def test_distenv_auto_error_line_is_redacted():
    """A broken launch under DISTENV_AUTO=1 ends the interpreter with one redacted line."""
    env = {**BASE, "MASTER_PORT": "https://bob:pw-auto-31@h:1"}
    code, text = _run([sys.executable, "-c", "print('script ran')"], {**env, "DISTENV_AUTO": "1"})
    assert code == 2 and "script ran" not in text, text
    assert text.startswith("distenv: error: ") and len(text.strip().splitlines()) == 1, text
    assert "pw-auto-31" not in text, text


@pytest.mark.parametrize("at", [5, 12])
def test_the_length_cap_never_cuts_a_secret_in_half(at):
    from distenv.errors import MAX_MESSAGE

    secret = "pw-cut-41-longpassword"
    # the cut (MAX_MESSAGE - 30, or anywhere near the end) falls `at` characters into the secret
    prefix = "MASTER_ADDR=" + "x" * (MAX_MESSAGE - 30 - len("MASTER_ADDR=https://alice:") - at)
    text = str(DistEnvError(prefix + f"https://alice:{secret}@host is not a host name"))
    assert secret[:at] not in text[len(prefix):], text[-80:]
