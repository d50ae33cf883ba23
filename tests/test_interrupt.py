"""A long run interrupted (Ctrl-C) keeps what it had: the error carries the partial result."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.backends.base import LoopResult


@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def _interrupt_second_chunk(monkeypatch, backend_name, when="read"):
    """Make the backend's compiled loops raise KeyboardInterrupt at their second chunk: when the
    driver reads its result (``when="read"``: where Ctrl-C lands while a chunk runs, on every
    backend) or when the chunk is called (``"call"``: on JAX that is while the chunk before it
    is still running, queued ahead of it)."""
    be = bdl.backends.get(backend_name)
    original = type(be).compile_loop

    def interrupt():
        raise KeyboardInterrupt

    def compile_loop(self, step, *args, **options):
        runner = original(self, step, *args, **options)
        calls = {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2 and when == "call":
                raise KeyboardInterrupt
            result = runner(*args, **kwargs)
            if calls["n"] == 2:
                return LoopResult(result.carry, result.outputs, interrupt)
            return result

        return interrupted

    monkeypatch.setattr(type(be), "compile_loop", compile_loop)


Y = np.random.default_rng(0).normal(1.0, 1.0, size=50)


def _fit_sgld(backend):
    """SG-MCMC in chunks of 40 steps: 20 warmup, then a draw per step."""
    return bdl.fit(mean_model(Y), backend=backend, method="sgld", step_size=1e-3, num_warmup=20,
                   num_samples=100, num_chains=1, chunk_size=40, progress=False)  # fmt: skip


def _fit_vi(backend):
    """VI in chunks of 200 steps."""
    return bdl.fit(mean_model(Y), backend=backend, method="vi", num_steps=1000, lr=0.05,
                   chunk_size=200, num_samples=10, progress=False)  # fmt: skip


def test_sgmcmc_interrupted_keeps_draws(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 40") as info:
        _fit_sgld(backend)
    partial = info.value.partial
    assert partial.samples["mu"].shape == (1, 20)  # steps 20..39 of the first chunk were kept


def test_vi_interrupted_keeps_parameters(backend, monkeypatch):
    _interrupt_second_chunk(monkeypatch, backend)
    with pytest.raises(bdl.InferenceError, match="interrupted at step 200") as info:
        _fit_vi(backend)
    partial = info.value.partial
    assert partial.losses.shape == (200,)
    assert partial.samples["mu"].shape == (1, 10)


def test_interrupt_while_a_chunk_is_queued_ahead_drops_the_unread_chunks(monkeypatch):
    """On JAX the next chunk is queued before the running one is read; Ctrl-C then stops at
    once, and the chunks not read yet are dropped (the run keeps what it had read)."""
    _interrupt_second_chunk(monkeypatch, "numpyro", when="call")
    with pytest.raises(bdl.InferenceError, match="interrupted at step 0") as info:
        _fit_sgld("numpyro")
    assert info.value.partial is None
    with pytest.raises(bdl.InferenceError, match="interrupted at step 0") as info:
        _fit_vi("numpyro")
    assert info.value.partial.losses.shape == (0,)


def test_interrupt_during_a_synchronous_call_keeps_the_chunks_before(monkeypatch):
    _interrupt_second_chunk(monkeypatch, "pyro", when="call")
    with pytest.raises(bdl.InferenceError, match="interrupted at step 40") as info:
        _fit_sgld("pyro")
    assert info.value.partial.samples["mu"].shape == (1, 20)
