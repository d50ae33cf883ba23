"""SG-MCMC kernels on a position in per-site blocks (how ``fit``'s loop holds it) draw what they
draw on the same position as one flat vector: the same seed gives the same chain, to float
tolerance, on both backends (the noise is one flat draw split into the blocks:
:func:`ppl_bdl.inference.mcmc.blocks.normal_like`)."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.mcmc import blocks as bt
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, sgmcmc_transition
from ppl_bdl.trace.layout import ModelDensity

STEPS = 6


@bdl.model
def mlp(X, y):
    f = nn.MLP("net", [3, 4, 1], activation="tanh", prior=dist.Normal(0.0, 1.0)).sample()
    s = bdl.sample("s", dist.HalfNormal(1.0))  # a scalar site: a block of shape ()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], s), obs=y[idx])


def _setup(backend):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 3)).astype(np.float32), rng.normal(size=30).astype(np.float32)
    return prepare(mlp(X, y), backend, "float32", 0)


def _kernels(dim: int):
    mass = np.linspace(0.5, 2.0, dim)
    cycles = dict(num_steps=STEPS, num_cycles=2, exploration=0.3)
    return [
        ("sgld", {}),
        ("sghmc", dict(friction=2.0, mass=mass, resample_every=2)),
        ("sghmc", dict(momentum_decay=0.2)),
        ("psgld", {}),
        ("csgld", cycles),
        ("csghmc", cycles),
    ]


def _run(backend, kernel, position):
    """``STEPS`` steps from ``position``, each with its own key from one seed; the last state
    and every step's info."""
    key = bdl.random.key(3)
    state, infos = kernel.init(position), []
    for _ in range(STEPS):
        key, sub = bdl.random.split(key)
        state, info = kernel.step(sub, state, None, 0.01)
        infos.append({k: float(backend.to_numpy(v)) for k, v in info.items()})
    return state, infos


def test_blocks_draw_what_the_flat_vector_draws(backend):
    setup = _setup(backend)
    be, layout = setup.backend, setup.layout
    density = ModelDensity(setup.bound, be, layout, setup.params)
    start = np.random.default_rng(1).normal(scale=0.5, size=layout.dim)
    assert len(layout.slots) == 5 and layout.slots[-1].unconstrained_shape == ()
    for name, settings in _kernels(layout.dim):
        kernel = bdl.kernels.get(name).factory(lambda p, _: density.value_and_grad(p), **settings)
        with be.scope(), be.activate():
            flat, flat_infos = _run(be, kernel, be.asarray(start))
            blocks, block_infos = _run(be, kernel, layout.blocks(be.asarray(start), be))
            joined = {
                k: be.to_numpy(layout.join(v, be))
                for k, v in blocks.items()
                if isinstance(v, tuple)
            }
        shapes = [tuple(b.shape) for b in blocks["position"]]
        assert shapes == [s.unconstrained_shape for s in layout.slots], name
        assert set(joined) == {k for k in flat if k != "count"}, name
        for k, value in joined.items():
            np.testing.assert_allclose(
                value, be.to_numpy(flat[k]), rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}"
            )
        moved = np.abs(joined["position"] - start).max()
        assert moved > 1e-3, (name, moved)  # the chain moved: the comparison is not vacuous
        for a, b in zip(flat_infos, block_infos, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (name, k)


def test_the_transition_holds_blocks_and_emits_the_flat_row(backend):
    setup = _setup(backend)
    be, layout = setup.backend, setup.layout
    transition, data = sgmcmc_transition(
        setup, SGMCMCConfig.build("sghmc", step_size=1e-3, batch_size=10), ("data", 30), 10
    )
    start = np.arange(layout.dim, dtype=np.float32) / layout.dim
    with be.scope(), be.activate():
        state = transition.init(be.random.key(0), be.asarray(start), data)
        # blocks where the backend fuses elementwise work (JAX); one flat vector on eager torch
        layout_type = tuple if be.fuses_elementwise else type(be.asarray(start))
        assert type(state["position"]) is layout_type and type(state["velocity"]) is layout_type
        np.testing.assert_array_equal(be.to_numpy(transition.emit(state)), start)
        np.testing.assert_array_equal(be.to_numpy(bt.join(state["position"])), start)


def test_a_mass_of_the_wrong_length_is_refused(backend):
    be = bdl.backends.get(backend)
    kernel = bdl.kernels.get("sghmc").factory(lambda p, _: (0.0, p), friction=1.0, mass=[1.0, 2.0])
    with be.activate(), pytest.raises(ConfigError, match="mass has 2 entries.*3 unconstrained"):
        kernel.step(
            bdl.random.key(0), kernel.init((be.asarray([1.0]), be.asarray([1.0, 2.0]))), None, 0.1
        )
