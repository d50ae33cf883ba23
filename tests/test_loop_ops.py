"""A regression guard that needs no clock: the operations of our compiled SG-MCMC loop, counted
against a hand-written ``jit(lax.scan)`` of the same update.

Two counts, both read off the programs JAX builds (no timing):

- **gates**: selects over floating arrays and conditionals (``stablehlo.select`` with a float
  tensor result, ``stablehlo.case``/``if``) in the lowered loop. A per-step gate (keep the new
  state only if the step was finite) is such a select; our CPU loop has none, like the
  hand-written one.
- **kernels per step**: the instructions XLA's CPU backend runs per iteration of the loop body
  (the non-fusion computation that holds the network's matrix products; of our loop's two
  copies of the step, the lean one that runs between kept steps), after optimisation. At a toy
  network's size each costs about a microsecond, a step a few dozen. The hand-written step is as
  lean as it gets (the gradient only, keys split ahead, as BlackJAX's users write it); ours may
  run one more (its key's hash, fused into one kernel by ``backends/numpyro/random.py``): between
  kept steps it computes no potential, no gradient norm, no info and no finite flag (the loop
  checks the state at kept steps and at the chunk's end; a non-finite state stays non-finite).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.loop import driver
from ppl_bdl.inference.loop.chunked_run import chunk_inputs
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.mcmc import blocks
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, sgmcmc_transition
from ppl_bdl.inference.setup import minibatch_plate

pytest.importorskip("jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from ppl_bdl.backends.numpyro.loop import chunk_header  # noqa: E402
from ppl_bdl.backends.numpyro.loop_ops import body_kernels, float_gates  # noqa: E402
from ppl_bdl.backends.numpyro.random import normal  # noqa: E402

N, B, STEPS, ROWS = 200, 10, 50, 2
#: Kernels per step ours may run beyond the lean hand-written step's (see the module docstring):
#: its key's hash (the hand-written step reads a key split ahead). When this guard was set: ours
#: 19, the hand-written step (per-layer blocks and the backend's Gaussian draw, as ours) 19,
#: ours with the potential computed every step again 22. History: with JAX's own draw (a rolled
#: loop) in both, ours 28 and hand-written 28; before that, with a finite flag of the new state
#: per lean step, ours 32 (the flag's reductions are four kernels here); with a flat position,
#: before the blocks, ours 25 against a flat hand-written step's 23.
KERNEL_MARGIN = 1


@bdl.model
def mlp(X, y):
    f = nn.MLP("net", [8, 16, 1], activation="tanh", prior=dist.Normal(0.0, 1.0)).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.1), obs=y[idx])


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 8)).astype(np.float32), rng.normal(size=N).astype(np.float32)


def _ours(wrap=None, wrap_init=None):
    """Our fast (CPU) chunk program for SGLD on ``mlp``, lowered; ``wrap`` changes the step,
    ``wrap_init`` the initial state."""
    setup = prepare(mlp(*_data()), "numpyro", "float32", 0)
    backend = setup.backend
    plate = minibatch_plate(setup, B)
    transition, data = sgmcmc_transition(
        setup, SGMCMCConfig.build("sgld", step_size=1e-4, batch_size=B), plate, STEPS
    )
    if wrap is not None:
        transition = transition._replace(step=wrap(transition.step))
    if wrap_init is not None:
        transition = transition._replace(init=wrap_init(transition.init))
    runner = backend.compile_loop(
        driver._loop_step(backend, transition, False, None), transition.emit
    )
    with backend.scope(), backend.activate():
        state = transition.init(
            backend.random.key(0), backend.asarray(np.zeros(setup.layout.dim)), data
        )
        xs = chunk_inputs(backend, STEPS, STEPS, [EpochBatches(N, B, 0)], False)
        inputs = (data, jnp.asarray(1e-4), backend.random.key(1))
        keep = np.zeros(STEPS, bool)
        keep[-ROWS:] = True
        header = chunk_header(keep, STEPS, 0, ROWS)
        return runner.fast.lower(
            state, xs, inputs, header, length=STEPS, num_rows=ROWS, trace=False
        )


def _hand():
    """SGLD on the same network and data, written by hand as lean as it gets in the layout ours
    holds (the position a tuple of per-layer blocks, one flat noise draw split into them, drawn
    as the backend draws it): ``jit(lax.scan)``, the gradient only (no potential), every step's
    key split ahead."""
    X, y = (jnp.asarray(a) for a in _data())
    shapes = [(8, 16), (16,), (16, 1), (1,)]
    sizes = [int(np.prod(s)) for s in shapes]

    def potential(blocks, idx):
        w1, b1, w2, b2 = blocks
        out = (jnp.tanh(X[idx] @ w1 + b1) @ w2 + b2)[:, 0]
        prior = sum(0.5 * jnp.sum(b * b) for b in blocks)
        return 0.5 * jnp.sum(((y[idx] - out) / 0.1) ** 2) * (N / B) + prior

    def body(blocks, x, rate):
        key, idx = x
        g = jax.grad(potential)(blocks, idx)
        flat = normal(key, (sum(sizes),), np.float32)  # the backend's draw, as ours
        pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
        noise = [p.reshape(s) for p, s in zip(pieces, shapes, strict=True)]
        scale = jnp.sqrt(2 * rate)
        new = tuple(b - rate * d + scale * e for b, d, e in zip(blocks, g, noise, strict=True))
        return new, None

    def run(blocks, key, idx, rate):
        keys = jax.random.split(key, STEPS)  # every step's key drawn ahead, as BlackJAX's users do
        return jax.lax.scan(lambda c, x: body(c, x, rate), blocks, (keys, idx))

    idx, rate = jnp.zeros((STEPS, B), jnp.int32), jnp.asarray(1e-4)
    return jax.jit(run).lower(tuple(jnp.zeros(s) for s in shapes), jax.random.PRNGKey(0), idx, rate)


def gates(lowered) -> int:
    return float_gates(lowered.as_text())


def kernels_per_step(lowered) -> int:
    return len(body_kernels(lowered.compile().as_text()))


def test_our_loop_has_no_per_step_gate_and_few_extra_kernels():
    ours, hand = _ours(), _hand()
    assert gates(ours) == gates(hand) == 0
    extra = kernels_per_step(ours) - kernels_per_step(hand)
    assert extra <= KERNEL_MARGIN, (kernels_per_step(ours), kernels_per_step(hand))


def test_the_guard_fails_when_a_per_step_gate_is_put_back():
    """A step that keeps its new state only where it is finite (the select the loop dropped)."""

    def gated(step):
        def step_with_gate(key, state, batch, rate):
            new, info = step(key, state, batch, rate)
            ok = bdl.math.isfinite(info["potential"])
            keep = partial(blocks.tree_map, lambda a, b: bdl.math.where(ok, a, b))
            return {k: keep(new[k], state[k]) for k in new}, info

        return step_with_gate

    assert gates(_ours(gated)) > 0


def test_the_guard_fails_when_the_potential_is_computed_every_step_again():
    """A step that adds its potential into a running sum in its state (so every step computes
    the potential, as our loop did before the lean steps): more kernels than the guard allows.
    (A potential merely carried in the state is not enough: XLA drops a loop's output that
    nothing reads, so that costs nothing.)"""

    def summing(step):
        def step_with_sum(key, state, batch, rate):
            new, info = step(key, state, batch, rate)
            return {**new, "potential_sum": state["potential_sum"] + info["potential"]}, info

        return step_with_sum

    def with_sum(init):
        def init_with_sum(key, position, data):
            state = init(key, position, data)
            return {**state, "potential_sum": blocks.scalar_zero(state["position"])}

        return init_with_sum

    ours = _ours(summing, with_sum)
    assert kernels_per_step(ours) - kernels_per_step(_hand()) > KERNEL_MARGIN
