"""Test setup: the `gpu` marker (skipped when no CUDA device is visible) and backend helpers."""
import os

import pytest


def _has_gpu() -> bool:
    if os.environ.get("FUSEDKIT_TEST_NO_GPU"):
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_TIMES = os.environ.get("FUSEDKIT_TEST_TIMES")  # tools/gpu_check.sh: one line per test as it ends


def pytest_runtest_logreport(report):
    """With FUSEDKIT_TEST_TIMES=path, appends "nodeid<TAB>phase<TAB>outcome<TAB>seconds" per test phase
    that is not a plain pass of setup / teardown, flushed at once: a run killed by its time limit still
    tells which files it finished, failed or spent its time in."""
    if not _TIMES or (report.when != "call" and report.passed):
        return
    with open(_TIMES, "a") as f:
        f.write(f"{report.nodeid}\t{report.when}\t{report.outcome}\t{report.duration:.3f}\n")
