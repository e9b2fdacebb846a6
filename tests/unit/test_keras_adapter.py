"""distenv.keras: chief-aware callbacks and keras.distribution arguments, on environments.

The fast tests use stand-in Keras classes; `test_real_keras_*` run the same checks with the
real tf-keras and Keras 3 in a subprocess of an interpreter that has them (.venvs/tensorflow).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

import distenv
import distenv.keras as dk
from distenv import DistEnvError
from envs import hydra_rank, platform, recorded, slurm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


# -- stand-in Keras ------------------------------------------------------------------------
@pytest.fixture
def fake_keras(monkeypatch):
    """A module `keras` with the callback classes distenv.keras touches."""
    mod = types.ModuleType("keras")
    cbs = types.ModuleType("keras.callbacks")

    def make(name, base=object, **attrs):
        cls = type(name, (base,), attrs)
        cls.__module__ = "keras.src.callbacks"
        return cls

    def set_model(self, model):  # Keras: fit() calls it on every callback, in order, first
        self.model = model

    Callback = make("Callback", set_model=set_model)
    cbs.Callback = Callback

    def progbar_set_params(self, params):
        self.verbose = params.get("verbose", 1)

    cbs.ProgbarLogger = make("ProgbarLogger", Callback, set_params=progbar_set_params)

    def init_path(attr):
        def __init__(self, path):
            setattr(self, attr, path)
        return __init__

    cbs.ModelCheckpoint = make("ModelCheckpoint", Callback, __init__=init_path("filepath"))
    cbs.TensorBoard = make("TensorBoard", Callback, __init__=init_path("log_dir"))
    cbs.CSVLogger = make("CSVLogger", Callback, __init__=init_path("filename"))
    cbs.EarlyStopping = make("EarlyStopping", Callback, __init__=lambda self: None)

    def bar_init(self, backup_dir):  # Keras 3 derives its file paths in __init__
        self.backup_dir = backup_dir
        self._weights_path = os.path.join(backup_dir, "latest.weights.h5")
        self._training_metadata_path = os.path.join(backup_dir, "training_metadata.json")
        self._prev_weights_path = self._weights_path + ".bkp"
        self._prev_training_metadata_path = self._training_metadata_path + ".bkp"

    cbs.BackupAndRestore = make("BackupAndRestore", Callback, __init__=bar_init)
    mod.callbacks = cbs
    monkeypatch.setitem(sys.modules, "keras", mod)
    monkeypatch.setitem(sys.modules, "keras.callbacks", cbs)
    monkeypatch.delitem(sys.modules, "distenv.tensorflow", raising=False)
    return mod


def user_callbacks(keras, out):
    c = keras.callbacks
    return [c.ModelCheckpoint(os.path.join(out, "model.keras")), c.TensorBoard(os.path.join(out, "tb")),
            c.CSVLogger(os.path.join(out, "log.csv")), c.BackupAndRestore(os.path.join(out, "backup")),
            c.EarlyStopping()]


def test_chief_keeps_the_users_paths(fake_keras, tmp_path):
    out = str(tmp_path)
    cbs = dk.callbacks(user_callbacks(fake_keras, out), env=distenv.resolve(recorded("openmpi4-np2", 0)))
    assert [type(c).__name__ for c in cbs] == ["ModelCheckpoint", "TensorBoard", "CSVLogger",
                                               "BackupAndRestore", "EarlyStopping"]
    assert cbs[0].filepath == os.path.join(out, "model.keras")
    assert cbs[1].log_dir == os.path.join(out, "tb")
    assert cbs[2].filename == os.path.join(out, "log.csv")
    # every worker, the chief too, backs up into a directory of its own
    assert cbs[3].backup_dir == os.path.join(out, "backup", "worker-0")
    assert cbs[3]._weights_path == os.path.join(out, "backup", "worker-0", "latest.weights.h5")


def test_other_workers_write_private_paths_that_are_removed(fake_keras, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    out = str(tmp_path / "out")
    cbs = dk.callbacks(user_callbacks(fake_keras, out), env=distenv.resolve(recorded("openmpi4-np2", 1)))
    names = [type(c).__name__ for c in cbs]
    assert names[0] == "DistenvScratch" and names[-2:] == ["SilentProgbarLogger", "DistenvCleanup"]
    private = os.path.dirname(cbs[1].filepath)
    assert private.startswith(str(tmp_path / "tmp")) and "distenv-worker1-" in private
    assert cbs[1].filepath == os.path.join(private, "model.keras")
    assert cbs[2].log_dir == os.path.join(private, "tb")
    assert cbs[3].filename == os.path.join(private, "log.csv")
    assert cbs[4].backup_dir == os.path.join(out, "backup", "worker-1")
    assert cbs[4]._prev_weights_path.endswith(os.path.join("worker-1", "latest.weights.h5.bkp"))
    assert os.path.isdir(private)
    bar = cbs[-2]
    bar.set_params({"verbose": 1})
    assert bar.verbose == 0
    fit_begins(cbs)  # the first fit keeps the directory made with the callbacks
    assert os.path.dirname(cbs[1].filepath) == private
    cbs[-1].on_train_end()
    assert not os.path.exists(private)
    fit_begins(cbs)  # a second fit() gets a directory again
    again = os.path.dirname(cbs[1].filepath)
    assert os.path.isdir(again) and cbs[2].log_dir == os.path.join(again, "tb")
    cbs[-1].on_train_end()
    assert not os.path.exists(again)


def fit_begins(cbs, model=None):
    """What Keras' fit() does with the callbacks before the first batch: set_model on each,
    in order (TensorBoard takes its log directory there), then on_train_begin on each."""
    for cb in cbs:
        if hasattr(cb, "set_model"):
            cb.set_model(model)
    for cb in cbs:
        if hasattr(cb, "on_train_begin"):
            cb.on_train_begin()


def test_each_fit_gets_a_fresh_private_directory_never_the_old_name(fake_keras, tmp_path, monkeypatch):
    """Issue 30, item 3: the directory of the fit before, once removed, is a free name in the
    shared temporary directory. Whoever creates it first (another user: a directory of theirs,
    mode 0777, or a symlink) must not receive the next fit's checkpoints and logs: the next fit
    gets a fresh mkdtemp directory, mode 0700, owned by this user."""
    import stat
    import tempfile

    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    cbs = dk.callbacks(user_callbacks(fake_keras, str(tmp_path / "out")),
                       env=distenv.resolve(recorded("openmpi4-np2", 1)))
    ckpt = next(c for c in cbs if type(c).__name__ == "ModelCheckpoint")
    fit_begins(cbs)
    first = os.path.dirname(ckpt.filepath)
    cbs[-1].on_train_end()
    assert not os.path.exists(first)
    os.mkdir(first)  # taken by someone else between the fits
    os.chmod(first, 0o777)
    fit_begins(cbs)
    second = os.path.dirname(ckpt.filepath)
    assert second != first and os.path.dirname(second) == str(shared)
    info = os.lstat(second)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    for cb in cbs:
        for attr in ("filepath", "log_dir", "filename"):
            if type(cb).__name__ != "BackupAndRestore" and getattr(cb, attr, None):
                assert os.path.dirname(getattr(cb, attr)) == second, (type(cb).__name__, attr)
    assert os.listdir(first) == []  # nothing written into the taken name
    cbs[-1].on_train_end()
    assert not os.path.exists(second)


def test_a_single_worker_keeps_everything(fake_keras, tmp_path):
    cbs = user_callbacks(fake_keras, str(tmp_path))
    out = dk.callbacks(cbs, env=distenv.resolve({}))
    assert out == cbs and out[3].backup_dir == os.path.join(str(tmp_path), "backup")


def test_a_users_progress_bar_is_replaced_off_chief(fake_keras):
    env = distenv.resolve(recorded("openmpi4-np2", 1))
    cbs = dk.callbacks([fake_keras.callbacks.ProgbarLogger()], env=env)
    assert [type(c).__name__ for c in cbs] == ["SilentProgbarLogger", "DistenvCleanup"]
    kept = dk.callbacks([fake_keras.callbacks.ProgbarLogger()], env=distenv.resolve(recorded("openmpi4-np2", 0)))
    assert [type(c).__name__ for c in kept] == ["ProgbarLogger"]


def test_verbose_and_chief(fake_keras):
    assert dk.verbose(2, env=distenv.resolve(recorded("openmpi4-np2", 0))) == 2
    assert dk.verbose(2, env=distenv.resolve(recorded("openmpi4-np2", 1))) == 0
    assert dk.is_chief(distenv.resolve({}))
    assert dk.worker_index(distenv.resolve(recorded("openmpi4-np2", 1))) == 1


def test_chief_from_tf_config_with_a_chief_task(fake_keras):
    cfg = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}
    env = distenv.resolve({"TF_CONFIG": json.dumps(cfg)})
    assert not dk.is_chief(env)  # rank 1: the chief task is rank 0


def test_tf_keras_under_a_multi_worker_strategy_shares_backup(fake_keras, monkeypatch):
    tfk = types.ModuleType("tf_keras")
    bar_cls = type("BackupAndRestore", (fake_keras.callbacks.Callback,),
                   {"__init__": lambda self, d: setattr(self, "backup_dir", d)})
    bar_cls.__module__ = "tf_keras.src.callbacks"
    tfk.callbacks = fake_keras.callbacks
    monkeypatch.setitem(sys.modules, "tf_keras", tfk)
    strategy = types.SimpleNamespace(extended=types.SimpleNamespace(_in_multi_worker_mode=lambda: True))
    env = distenv.resolve(recorded("openmpi4-np2", 1))
    (cb, *_) = dk.callbacks([bar_cls("/shared/backup")], env=env, strategy=strategy)
    assert cb.backup_dir == "/shared/backup"  # tf-keras shares it between chief and workers
    single = types.SimpleNamespace(extended=types.SimpleNamespace(_in_multi_worker_mode=lambda: False))
    (cb, *_) = dk.callbacks([bar_cls("/shared/backup")], env=env, strategy=single)
    assert cb.backup_dir == os.path.join("/shared/backup", "worker-1")


# -- keras.distribution ----------------------------------------------------------------------
def test_initialize_args_one_node():
    a0 = dk.initialize_args(recorded("openmpi4-np2", 0))
    a1 = dk.initialize_args(recorded("openmpi4-np2", 1))
    assert a0["job_addresses"] == a1["job_addresses"]
    assert a0["job_addresses"].startswith("127.0.0.1:")
    assert (a0["num_processes"], a0["process_id"], a1["process_id"]) == (2, 0, 1)


def test_initialize_args_avoid_torchruns_port():
    env = recorded("torchrun-nproc2", 1)
    args = dk.initialize_args(env)
    host = env["MASTER_ADDR"]
    assert args["job_addresses"].startswith(host + ":")
    assert args["job_addresses"] != f"{host}:{env['MASTER_PORT']}"
    assert dk.initialize_args(env, port=1234)["job_addresses"] == f"{host}:1234"
    assert dk.initialize_args({**env, "DISTENV_KERAS_PORT": "2345"})["job_addresses"] == f"{host}:2345"


def test_initialize_args_across_slurm_nodes():
    env = slurm(3, nodelist="gpu[08-09]", job="9")
    args = dk.initialize_args(env)
    assert args["job_addresses"].startswith("gpu08:") and args["process_id"] == 3


def test_initialize_args_per_node_launch(fake_gpus):
    fake_gpus(4)
    env = platform("sagemaker_no_launcher_2hosts_host2")
    args = dk.initialize_args(env)
    assert (args["num_processes"], args["process_id"]) == (2, 1)
    assert args["job_addresses"].startswith("algo-1:")


def test_initialize_args_without_coordinator_names_the_fix():
    env = hydra_rank(1, 4, 1, 2)
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        dk.initialize_args(env)


def test_initialize_calls_keras_for_jax_only(monkeypatch):
    seen = {}
    mod = types.ModuleType("keras")
    mod.backend = types.SimpleNamespace(backend=lambda: "jax")
    mod.distribution = types.SimpleNamespace(initialize=lambda **kw: seen.update(kw))
    monkeypatch.setitem(sys.modules, "keras", mod)
    env = distenv.resolve(recorded("openmpi4-np2", 1))
    monkeypatch.delenv("KERAS_DISTRIBUTION_PROCESS_ID", raising=False)
    args = dk.initialize(env, set_environ=True)
    assert seen == args and seen["process_id"] == 1
    assert os.environ.pop("KERAS_DISTRIBUTION_PROCESS_ID") == "1"
    os.environ.pop("KERAS_DISTRIBUTION_NUM_PROCESSES")
    os.environ.pop("KERAS_DISTRIBUTION_JOB_ADDRESSES")
    mod.backend = types.SimpleNamespace(backend=lambda: "tensorflow")
    with pytest.raises(DistEnvError, match="JAX backend only"):
        dk.initialize(env)


# -- with the real Keras (tf-keras and Keras 3) --------------------------------------------------
def tensorflow_python():
    for py in (os.environ.get("DISTENV_PY_TENSORFLOW"), os.path.join(ROOT, ".venvs", "tensorflow", "bin", "python")):
        if py and os.access(py, os.X_OK):
            return py
    msg = "no interpreter with TensorFlow/Keras (set DISTENV_PY_TENSORFLOW or run integrations/frameworks/tensorflow.sh)"
    if os.environ.get("DISTENV_REQUIRE_LAUNCHERS") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


REAL = r"""
import contextlib, glob, io, json, os, sys, tempfile
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import keras, tf_keras
import distenv, distenv.keras as dk
base = os.getcwd()
for flavour, mod in (("tf_keras", tf_keras), ("keras", keras)):
    for role in ("chief", "worker"):
        rank = "0" if role == "chief" else "1"
        env = distenv.resolve({"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": "2",
                               "OMPI_COMM_WORLD_LOCAL_RANK": rank, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
        here = os.path.join(base, flavour + "-" + role)
        out, tmp = os.path.join(here, "out"), os.path.join(here, "tmp")
        os.makedirs(tmp)
        tempfile.tempdir = tmp
        ckpt = os.path.join(out, "model.keras" if flavour == "keras" else "model.h5")
        c = mod.callbacks
        cbs = dk.callbacks([c.ModelCheckpoint(ckpt), c.CSVLogger(os.path.join(out, "log.csv")),
                            c.TensorBoard(os.path.join(out, "tb")), c.BackupAndRestore(os.path.join(out, "backup"))],
                           env=env)
        ckpt_cb = next(cb for cb in cbs if type(cb).__name__ == "ModelCheckpoint")
        private = os.path.dirname(ckpt_cb.filepath)
        model = mod.Sequential([mod.layers.Input((3,)), mod.layers.Dense(1)])
        model.compile("sgd", "mse")
        x = np.ones((8, 3), "float32")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            model.fit(x, x[:, :1], epochs=2, batch_size=4, callbacks=cbs, verbose=1)
        private_left = os.path.exists(private)
        second = taken = None
        if role == "worker":
            # a second fit with the same callbacks, the first fit's directory name taken meanwhile
            os.makedirs(private)
            with contextlib.redirect_stdout(printed):
                model.fit(x, x[:, :1], epochs=1, batch_size=4, callbacks=cbs, verbose=1)
            second = os.path.dirname(ckpt_cb.filepath)
            # (distenv removing it at the fit's end would mean it trained into it too)
            taken = sorted(os.listdir(private)) if os.path.isdir(private) else "removed"
            if os.path.isdir(private):
                os.rmdir(private)
        files = sorted(os.path.relpath(p, out) for p in glob.glob(out + "/**", recursive=True) if os.path.isfile(p))
        print("REAL " + json.dumps({"flavour": flavour, "role": role, "private": private,
                                    "private_left": private_left, "tmp_left": os.listdir(tmp),
                                    "second": second, "taken": taken,
                                    "files": files, "printed": printed.getvalue()[-2000:]}), flush=True)
"""


@pytest.fixture(scope="module")
def real_keras(tmp_path_factory):
    """One subprocess runs fit() with chief-aware callbacks as chief and as worker, with
    tf-keras and with Keras 3 (TensorFlow backend), each in its own directory."""
    py = tensorflow_python()
    tmp = tmp_path_factory.mktemp("real-keras")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.path.join(ROOT, "src"),
           "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": "",
           "HOME": str(tmp)}
    p = subprocess.run(["timeout", "-k", "5", "280", py, "-c", REAL], env=env, cwd=str(tmp),
                       capture_output=True, text=True, timeout=300)
    results = {}
    for line in p.stdout.splitlines():
        if line.startswith("REAL "):
            r = json.loads(line[5:])
            results[(r["flavour"], r["role"])] = r
    assert p.returncode == 0 and len(results) == 4, p.stdout[-2000:] + p.stderr[-3000:]
    return results


@pytest.mark.parametrize("flavour", ["tf_keras", "keras"])
@pytest.mark.parametrize("role", ["chief", "worker"])
def test_real_keras_callbacks(real_keras, flavour, role):
    res = real_keras[(flavour, role)]
    ckpt = "model.h5" if flavour == "tf_keras" else "model.keras"
    if role == "chief":
        assert ckpt in res["files"] and "log.csv" in res["files"]
        assert any(f.startswith("tb" + os.sep) for f in res["files"])
        assert "2/2" in res["printed"]  # the chief shows progress
    else:
        # nothing of the worker's checkpoint/log lands in the user's directory ...
        assert ckpt not in res["files"] and "log.csv" not in res["files"]
        assert not any(f.startswith("tb" + os.sep) for f in res["files"])
        # ... its private directory is gone, and it printed no progress bar
        assert not res["private_left"] and res["tmp_left"] == [] and res["printed"] == ""
        # a second fit writes into a fresh directory, never into the first one's name, which
        # anyone could have taken after its removal (issue 30, item 3)
        assert res["second"] != res["private"] and res["taken"] == []
    # BackupAndRestore: a directory per worker (no multi-worker strategy here)
    assert not [f for f in res["files"] if f.startswith("backup" + os.sep) and "worker-" not in f]
