"""Shared fixtures: a backend fixture over every installed backend, and the shared data folder."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import ppl_bdl as bdl

BACKENDS = bdl.backends.available()


def pytest_configure(config):
    # Tiny models on a shared 2-core machine: torch's intra-op threads spin against each other
    # and other processes (a 25x slowdown measured on a small BNN); one thread is fastest here.
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
    # XLA compilation dominates short NumPyro runs; a session-local persistent cache lets the
    # second fit of an identical model (reproducibility checks, the second sequential chain) reuse
    # the first one's executable. Opt out with PPL_BDL_TEST_JAX_CACHE=0.
    if os.environ.get("PPL_BDL_TEST_JAX_CACHE", "1") == "0":
        return
    if importlib.util.find_spec("jax") is None:
        return
    import tempfile

    import jax

    cache = Path(tempfile.gettempdir()) / f"ppl_bdl_test_jax_cache_{os.getpid()}"
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    import shutil
    import tempfile

    shutil.rmtree(
        Path(tempfile.gettempdir()) / f"ppl_bdl_test_jax_cache_{os.getpid()}", ignore_errors=True
    )


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder (../shared/data next to the repository, or $PPL_BDL_DATA).

    Fails, rather than skips, with a message saying where it looked: the reference checks are
    part of the suite, not optional.
    """
    override = os.environ.get("PPL_BDL_DATA")
    root = (
        Path(override).expanduser()
        if override
        else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    )
    if not (root / "posteriordb").is_dir():
        pytest.fail(
            f"shared data not found: expected {root / 'posteriordb'}. Place the shared data folder "
            "next to the repository as ../shared/data, or set PPL_BDL_DATA to the folder that "
            "holds posteriordb/.",
            pytrace=False,
        )
    return root
