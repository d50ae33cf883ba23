"""A long run interrupted (Ctrl-C) keeps what it had: the error carries the partial result, for
SG-MCMC, VI and NUTS on every backend."""

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


def _interrupt_second_chunk(monkeypatch, backend_name, chunk: int = 2):
    """Make the backend's compiled loops raise KeyboardInterrupt (Ctrl-C) while their second (or
    ``chunk``-th) chunk runs."""
    be = bdl.backends.get(backend_name)
    original = type(be).compile_loop

    def compile_loop(self, step, emit):
        runner = original(self, step, emit)
        calls = {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == chunk:
                raise KeyboardInterrupt
            return runner(*args, **kwargs)

        return interrupted

    monkeypatch.setattr(type(be), "compile_loop", compile_loop)


Y = np.random.default_rng(0).normal(1.0, 1.0, size=50)


def test_sgmcmc_interrupted_keeps_draws(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 40") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="sgld",
            step_size=1e-3,
            num_warmup=20,
            num_samples=100,
            num_chains=1,
            chunk_size=40,
            progress=False,
        )
    assert info.value.partial.samples["mu"].shape == (1, 20)  # steps 20..39 of the first chunk


def test_vi_interrupted_keeps_parameters(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 200") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="vi",
            num_steps=1000,
            lr=0.05,
            chunk_size=200,
            num_samples=10,
            progress=False,
        )
    partial = info.value.partial
    assert partial.losses.shape == (200,)
    assert partial.samples["mu"].shape == (1, 10)


def test_vi_interrupted_in_its_first_chunk_keeps_the_initial_parameters(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend, chunk=1)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 0") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="vi",
            num_steps=1000,
            lr=0.05,
            chunk_size=200,
            num_samples=10,
            progress=False,
        )
    partial = info.value.partial
    assert partial.losses.shape == (0,)
    assert partial.samples["mu"].shape == (1, 10) and np.all(np.isfinite(partial.samples["mu"]))


def test_nuts_interrupted_keeps_draws(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(bdl.InferenceError, match="NUTS was interrupted at step 60") as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            method="nuts",
            num_warmup=30,
            num_samples=100,
            num_chains=1,
            chunk_size=60,
            progress=False,
        )
    partial = info.value.partial
    assert partial.samples["mu"].shape == (1, 30)  # draws 30..59 of the first chunk
    assert partial.sample_stats["diverging"].shape == (1, 30)
    assert abs(partial.samples["mu"].mean() - Y.mean()) < 0.5
