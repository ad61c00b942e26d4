"""Shared fixtures. GPU tests carry ``@pytest.mark.gpu`` and are skipped where no CUDA GPU is visible."""

import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and jax share the GPU in tests


@pytest.fixture
def rng(request):
    """A fresh seeded generator per test (seeded by the test's name, so failures reproduce)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _gpu_present() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
