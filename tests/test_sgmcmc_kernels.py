"""SG-MCMC kernels driven directly: SGHMC's own toy (Chen et al. 2014, Fig. 1), schedules, and the
kernel contract (state, info) on both backends."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.inference.mcmc.schedules import (
    cyclical_step_size,
    make_schedule,
    polynomial_step_size,
    sampling_stage_mask,
)


def _toy_moments():
    """E[θ²], E[θ⁴] under p(θ) ∝ exp(2θ² − θ⁴), by quadrature on a fine grid."""
    grid = np.linspace(-4.0, 4.0, 200_001)
    density = np.exp(2 * grid**2 - grid**4)
    z = density.sum()
    return (grid**2 * density).sum() / z, (grid**4 * density).sum() / z


def _run_toy(settings: dict, chains: int = 100, steps: int = 10_000, burn: int = 1_000):
    """SGHMC on U(θ) = −2θ² + θ⁴ with ∇U corrupted by N(0, 2²) noise (Chen et al. 2014, Fig. 1),
    ε = 0.1 and M = 1, i.e. learning rate η = ε² = 0.01; many chains vectorised with JAX."""
    import jax
    import jax.numpy as jnp

    backend = bdl.backends.get("numpyro")

    def noisy_value_and_grad(theta, key_grad):  # the minibatch is the gradient noise's key
        noise = 2.0 * jax.random.normal(key_grad, theta.shape)
        return (theta**4 - 2 * theta**2).sum(), 4 * theta**3 - 4 * theta + noise

    kernel = bdl.kernels.get("sghmc").factory(noisy_value_and_grad, **settings)

    def chain(key, x0):
        with backend.activate():
            state = kernel.init(x0)

        def body(state, key):
            key_grad, key_step = jax.random.split(key)
            with backend.activate():
                state, _ = kernel.step(key_step, state, key_grad, 0.01)
            return state, state["position"][0]

        _, xs = jax.lax.scan(body, state, jax.random.split(key, steps))
        return xs[burn:]

    keys = jax.random.split(jax.random.PRNGKey(0), chains)
    xs = np.asarray(jax.jit(jax.vmap(chain))(keys, jnp.zeros((chains, 1))), dtype=np.float64)
    return (xs**2).mean(), (xs**4).mean()


def test_sghmc_toy_matches_quadrature():
    e2, e4 = _toy_moments()
    assert e2 == pytest.approx(0.8327, abs=1e-3) and e4 == pytest.approx(1.0827, abs=1e-3)
    # The paper's settings: C = 3, and B̂ = ½ ε V̂ = 0.2 for the known gradient noise V = 4.
    m2, m4 = _run_toy(dict(friction=3.0, noise_estimate=0.2))
    # MC standard errors are ~0.002 (E[θ²]) and ~0.003 (E[θ⁴]); the rest is discretisation bias.
    assert m2 == pytest.approx(e2, rel=0.02)
    assert m4 == pytest.approx(e4, rel=0.02)


def test_naive_sghmc_without_friction_does_not_match():
    e2, e4 = _toy_moments()
    # Hamiltonian dynamics with the noisy gradient, momentum resampled every 50 steps, no friction.
    m2, m4 = _run_toy(dict(friction=0.0, resample_every=50))
    assert not np.isfinite(m4) or abs(m4 / e4 - 1) > 0.1 or abs(m2 / e2 - 1) > 0.05


def _quadratic(x, minibatch):
    return 0.5 * (x * x).sum(), x


@pytest.mark.parametrize("method", ["sgld", "sghmc", "psgld", "csgld", "csghmc"])
def test_kernel_contract_on_both_backends(backend, method):
    be = bdl.backends.get(backend)
    settings = {"num_steps": 10} if method.startswith("c") else {}
    kernel = bdl.kernels.get(method).factory(_quadratic, **settings)
    with be.activate():
        state = kernel.init(be.asarray(np.array([1.0, -1.0])))
        key = bdl.random.key(0)
        for _ in range(3):
            key, sub = bdl.random.split(key)
            state, info = kernel.step(sub, state, None, be.asarray(0.01))
    assert "position" in state and tuple(state["position"].shape) == (2,)
    assert {"step_size", "grad_norm", "potential"} <= set(info)
    if method in ("sghmc", "csghmc"):
        assert "kinetic_energy" in info
    assert all(np.ndim(be.to_numpy(v)) == 0 for v in info.values())


def test_schedules_written_once_run_on_both_backends(backend):
    be = bdl.backends.get(backend)
    t = np.arange(12)
    with be.activate():
        const = be.to_numpy(make_schedule("constant", 0.1, num_steps=12)(t))
        poly = be.to_numpy(polynomial_step_size(0.1, decay_offset=2.0, decay_power=0.75)(t))
        cyc = be.to_numpy(cyclical_step_size(0.1, num_steps=12, num_cycles=3)(t))
    np.testing.assert_allclose(const, 0.1, rtol=1e-6)
    np.testing.assert_allclose(poly, 0.1 * (1 + t / 2.0) ** -0.75, rtol=1e-5)
    # Eq. 2.10 with t counted from 1: α_t = α0/2 [cos(π mod(t − 1, ⌈T/M⌉)/⌈T/M⌉) + 1]
    length = 4
    expected = 0.05 * (np.cos(np.pi * np.mod(t, length) / length) + 1)
    np.testing.assert_allclose(cyc, expected, rtol=1e-5, atol=1e-8)


def test_sampling_stage_mask():
    mask = sampling_stage_mask(20, 2, 0.8)
    assert mask.tolist() == ([False] * 8 + [True] * 2) * 2


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: polynomial_step_size(0.1, decay_power=0.5), "decay_power"),
        (lambda: polynomial_step_size(0.1, decay_power=1.2), "decay_power"),
        (lambda: make_schedule("cosine", 0.1, num_steps=10), "unknown schedule 'cosine'"),
        (lambda: make_schedule("constant", -0.1, num_steps=10), "step_size must be a positive"),
        (lambda: cyclical_step_size(0.1, num_steps=3, num_cycles=5), "num_cycles=5"),
        (
            lambda: bdl.kernels.get("sghmc").factory(_quadratic, friction=1.0, momentum_decay=0.1),
            "not both",
        ),
        (lambda: bdl.kernels.get("sgld").factory(_quadratic, temperature=-1.0), "temperature"),
        (lambda: bdl.kernels.get("psgld").factory(_quadratic, decay=1.0), "decay"),
        (
            lambda: bdl.kernels.get("csgld").factory(_quadratic, num_steps=10, exploration=1.0),
            "exploration",
        ),
    ],
)
def test_kernel_and_schedule_settings_errors(call, match):
    with pytest.raises(bdl.ConfigError, match=match):
        call()
