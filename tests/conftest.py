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
