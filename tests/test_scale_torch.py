"""Data-parallel steps on torch: ``fit(..., backend="pyro", device=[...],
shard="data")`` in two gloo processes on the CPU (torch.distributed, one process per device,
started here as a launcher would: RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free port) draws
what one process draws unsplit, to float tolerance, and both processes draw the same: each
computes its half of every minibatch's gradient and the halves are all-reduced. Outside a
process group the option is a clear error that says how to start the processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale_fits  # noqa: E402

pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

#: float32 over 40 steps: the two halves' sums, all-reduced, round differently from one sum.
ATOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo(names, world: int = 2) -> list[dict]:
    """``scale_fits.run(names)`` on torch in ``world`` gloo processes; each process's results."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}.npz" for r in range(world)]
        procs = []
        for rank, out in enumerate(outs):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            cmd = [sys.executable, str(HERE / "scale_fits.py"), "--torch", str(out), *names]
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-4000:]
        results = []
        for out in outs:
            with np.load(out) as saved:
                results.append({k: saved[k] for k in saved.files})
    return results


def test_two_gloo_processes_draw_what_one_process_draws():
    """SGHMC (two chains, one after another) and a mean-field VI fit, each minibatch of 8
    split 4 + 4 over two processes: the same draws (and VI losses) as the
    unsplit fit in this process, and the same in both processes."""
    names = ["sghmc_data", "vi_data"]
    ranks = _gloo(names)
    one = scale_fits.run(names, backend="pyro")
    for rank in ranks:
        assert sorted(rank) == sorted(one)
        for key, value in one.items():
            np.testing.assert_allclose(rank[key], value, atol=ATOL, rtol=1e-5, err_msg=key)
    for key in one:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)


def test_data_parallel_torch_outside_a_process_group_says_how_to_start_one(monkeypatch):
    """Without torch.distributed's launcher variables (and no process group) the fit is
    refused, naming torchrun and the number of processes; one device with shard="data" is
    the unsplit fit. (A list of devices for chains: tests/test_scale.py.)"""
    if dist.is_initialized():  # pragma: no cover - a test session run under torchrun
        pytest.skip("this process is in a process group")
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    bound = scale_fits.regression(*scale_fits.data())
    options = dict(
        backend="pyro",
        method="sgld",
        step_size=1e-3,
        batch_size=8,
        num_warmup=5,
        num_samples=5,
        progress=False,
    )
    with pytest.raises(bdl.BackendError, match="torchrun --nproc_per_node=2"):
        bdl.fit(bound, device=["cpu", "cpu"], shard="data", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = bdl.fit(bound, device="cpu", shard="data", **options)  # one device: unsplit
    assert post.samples["w"].shape == (4, 5, 2)
