"""Shared fixtures: a backend fixture over every installed backend, and the shared data folder."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# On a GPU host: several pytest workers share the GPU, so no process may take most of its memory
# up front (JAX's default) -- set before JAX is imported.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import ppl_bdl as bdl  # noqa: E402

#: The built-in backends installed here (a test-only third backend runs in test_conformance.py).
BACKENDS = [name for name in bdl.backends.available() if name in ("numpyro", "pyro")]


def pytest_configure(config):
    # Tiny models on a shared 2-core machine: torch's intra-op threads spin against each other
    # and other processes (a 25x slowdown measured on a small BNN); one thread is fastest here.
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
        # Exact float32 on GPUs: the tests compare with float64 references (torch's matmuls are
        # exact by default; cuDNN's convolutions use TF32 unless told otherwise).
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    if importlib.util.find_spec("jax") is not None:
        import jax

        # JAX's default float32 matmul on recent NVIDIA GPUs is TF32 (about 3 digits): the tests
        # check values against float64 references, so they ask for full float32.
        jax.config.update("jax_default_matmul_precision", "highest")
    # A session-local persistent compilation cache lets the second fit of an identical model reuse
    # the first one's executable, also after the in-memory programs are dropped (below). Opt out
    # with PPL_BDL_TEST_JAX_CACHE=0. (A CI run crashed in this cache's write: the process had run
    # out of memory maps, see MAX_MAPS; without the cache the same run crashed in XLA's compile.)
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


#: Most test processes ``-n auto`` starts (pytest-xdist, in the default options): each holds its
#: own JAX and torch, and XLA's thread pools take every core, so more than a few only crowd.
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process per core this process may run on, at most
    :data:`MAX_WORKERS` (two on CI's two cores); each runs whole files (``--dist loadfile``), so
    a module's fixtures (a local Ray cluster, a fitted model) are made once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_WORKERS))


def pytest_unconfigure(config):
    import shutil
    import tempfile

    shutil.rmtree(
        Path(tempfile.gettempdir()) / f"ppl_bdl_test_jax_cache_{os.getpid()}", ignore_errors=True
    )


#: Memory maps a test process may hold before its compiled JAX programs are dropped. XLA's CPU
#: backend maps about three regions per compiled program and keeps them while a jit cache holds
#: the program; past Linux's vm.max_map_count (65530 by default) the next compile's mmap fails
#: and XLA dies with SIGSEGV. One run of this suite compiles enough programs to get there (it
#: crashed in test_interrupt.py, 45% of the way, in CI).
MAX_MAPS = 20000


def _memory_maps() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:  # not Linux: no such limit to keep under
        return 0


@pytest.fixture(autouse=True)
def _drop_compiled_programs_past_the_limit():
    """JAX's compiled programs are dropped (``jax.clear_caches``) after a test that leaves the
    process above :data:`MAX_MAPS` memory maps: a few times a run, so the process keeps under
    vm.max_map_count; the persistent compilation cache (pytest_configure) gives them back cheaply."""
    yield
    if "jax" in sys.modules and _memory_maps() > MAX_MAPS:
        sys.modules["jax"].clear_caches()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


#: Set to 1 to make a missing shared data folder fail the tests that need it instead of skipping
#: them (CI sets it where ../shared is present, so those tests can never pass by being skipped).
REQUIRE_SHARED_ENV = "PPL_BDL_REQUIRE_SHARED"


#: The tests measured too long for the default run (see the file's header): marked slow.
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def _measured_slow() -> set[str]:
    lines = SLOW_TESTS.read_text().splitlines()
    return {line.split("#")[0].strip() for line in lines} - {""}


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects
def pytest_collection_modifyitems(config, items):
    # The tests listed in slow_tests.txt are slow. Every test that uses the shared_data fixture
    # carries the marker of the same name, so `-m shared_data` runs exactly the tests that need
    # the full shared data sets. A test marked slow_on("pyro") is slow when its `backend`
    # fixture is Pyro: the same statistical check on the other backend stays in the default run.
    measured_slow = _measured_slow()
    for item in items:
        if item.nodeid in measured_slow:
            item.add_marker(pytest.mark.slow)
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)
        slow_on = item.get_closest_marker("slow_on")
        callspec = getattr(item, "callspec", None)
        if slow_on and callspec is not None and callspec.params.get("backend") in slow_on.args:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder (../shared/data next to the repository, or $PPL_BDL_DATA), for the
    tests that need the full shared sets (diamonds, UCI); the small reference posteriors ship
    with the package.

    Skips, saying where it looked, when the folder is absent (a fresh clone has no ../shared);
    fails instead when $PPL_BDL_REQUIRE_SHARED=1.
    """
    override = os.environ.get("PPL_BDL_DATA")
    root = (
        Path(override).expanduser()
        if override
        else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    )
    if not (root / "posteriordb").is_dir():
        reason = (
            f"shared data not found: expected {root / 'posteriordb'}. Place the shared data "
            "folder next to the repository as ../shared/data, or set PPL_BDL_DATA to the folder "
            "that holds posteriordb/."
        )
        if os.environ.get(REQUIRE_SHARED_ENV) == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return root
