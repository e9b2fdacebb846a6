"""The suite's pytest-xdist units (tests/conftest.py, xdist_unit): the tests that start launchers
on shared ports share one worker, and a new module marked `launcher` cannot slip out of it."""
import glob
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _conftest():
    spec = importlib.util.spec_from_file_location("distenv_root_conftest_copy",
                                                  os.path.join(ROOT, "tests", "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_launcher_tests_share_one_unit_and_other_modules_are_their_own():
    unit = _conftest().xdist_unit
    assert unit("tests/integration/test_layouts.py::test_x[openmpi4-np4]") == "launchers"
    assert unit("tests/reliability/test_concurrency.py::test_y") == "launchers"
    assert unit("tests/e2e/test_transformers_e2e.py::test_t5_baseline_two_jobs_collide_on_port_29500") == "launchers"
    assert unit("tests/e2e/test_jax_e2e.py::test_z") == "tests/e2e/test_jax_e2e.py"
    assert unit("tests/unit/test_hostlist.py::test_a[1]") == "tests/unit/test_hostlist.py"


def test_every_module_marked_launcher_outside_e2e_is_in_the_serial_unit():
    unit = _conftest().xdist_unit
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith("tests/e2e/") or path == os.path.abspath(__file__):
            continue  # e2e modules run their jobs on ports of their own (launch_pool.py)
        with open(path, encoding="utf-8") as fh:
            if "mark.launcher" in fh.read():
                assert unit(rel + "::t") == "launchers", rel
