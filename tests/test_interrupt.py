"""A long run interrupted (Ctrl-C) keeps what it had: the error carries the partial result."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def _interrupt_second_chunk(monkeypatch, backend_name):
    """Make the backend's compiled loops raise KeyboardInterrupt on their second call."""
    be = bdl.backends.get(backend_name)
    original = type(be).compile_loop

    def compile_loop(self, step, *args, **options):
        runner = original(self, step, *args, **options)
        calls = {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return runner(*args, **kwargs)

        return interrupted

    monkeypatch.setattr(type(be), "compile_loop", compile_loop)


def test_sgmcmc_interrupted_keeps_draws(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    y = np.random.default_rng(0).normal(1.0, 1.0, size=50)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 40") as info:
        bdl.fit(mean_model(y), backend=backend, method="sgld", step_size=1e-3, num_warmup=20,
                num_samples=100, num_chains=1, chunk_size=40, progress=False)  # fmt: skip
    partial = info.value.partial
    assert partial.samples["mu"].shape == (1, 20)  # steps 20..39 of the first chunk were kept


def test_vi_interrupted_keeps_parameters(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    y = np.random.default_rng(0).normal(1.0, 1.0, size=50)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 200") as info:
        bdl.fit(mean_model(y), backend=backend, method="vi", num_steps=1000, lr=0.05,
                chunk_size=200, num_samples=10, progress=False)  # fmt: skip
    partial = info.value.partial
    assert partial.losses.shape == (200,)
    assert partial.samples["mu"].shape == (1, 10)
