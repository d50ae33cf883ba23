"""A regression guard that needs no clock: the operations of our compiled SG-MCMC loop, counted
against a hand-written ``jit(lax.scan)`` of the same update (issue 22).

Two counts, both read off the programs JAX builds (no timing):

- **gates**: selects over floating arrays and conditionals (``stablehlo.select`` with a float
  tensor result, ``stablehlo.case``/``if``) in the lowered loop. A per-step gate (keep the new
  state only if the step was finite) is such a select; our CPU loop has none, like the
  hand-written one.
- **kernels per step**: the instructions XLA's CPU backend runs per iteration of the loop body
  (the non-fusion computation that holds the network's matrix products), after optimisation.
  At a toy network's size each costs about a microsecond, a step a few dozen: ours may run a
  stated few more than the hand-written step (the model's per-site prior sums, the kernel's
  gradient norm, the finite flag, the per-step infos).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.inference import driver
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.minibatch import EpochBatches
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.inference.sgmcmc import SGMCMCConfig, sgmcmc_transition

pytest.importorskip("jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

N, B, STEPS, ROWS = 200, 10, 50, 2
#: Kernels per step ours may run beyond the hand-written step's (see the module docstring).
KERNEL_MARGIN = 12


@bdl.model
def mlp(X, y):
    f = nn.MLP("net", [8, 16, 1], activation="tanh", prior=dist.Normal(0.0, 1.0)).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.1), obs=y[idx])


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 8)).astype(np.float32), rng.normal(size=N).astype(np.float32)


def _ours(wrap=None):
    """Our fast (CPU) chunk program for SGLD on ``mlp``, lowered; ``wrap`` changes the step."""
    setup = prepare(mlp(*_data()), "numpyro", "float32", 0)
    be = setup.backend
    plate = minibatch_plate(setup, B)
    transition, data = sgmcmc_transition(
        setup, SGMCMCConfig.build("sgld", step_size=1e-4, batch_size=B), plate, STEPS
    )
    if wrap is not None:
        transition = transition._replace(step=wrap(transition.step))
    runner = be.compile_loop(driver._loop_step(be, transition, False), transition.emit)
    with be.scope(), be.activate():
        state = transition.init(be.random.key(0), be.asarray(np.zeros(setup.layout.dim)), data)
        xs = driver._inputs(be, STEPS, 0, STEPS, [EpochBatches(N, B, 0)], [be.random.key(1)],
                            np.full(STEPS, 1e-4), False)  # fmt: skip
        count = jnp.asarray(STEPS, jnp.int32)
        return runner.fast.lower(state, xs, data, count, jnp.zeros(ROWS + 1, jnp.int32),
                                 num_rows=ROWS, trace=False)  # fmt: skip


def _hand():
    """SGLD on the same network and data, written by hand: ``jit(lax.scan)``, the flat vector."""
    X, y = (jnp.asarray(a) for a in _data())

    def potential(flat, idx):
        w1, b1 = flat[:128].reshape(8, 16), flat[128:144]
        w2, b2 = flat[144:160].reshape(16, 1), flat[160:161]
        out = (jnp.tanh(X[idx] @ w1 + b1) @ w2 + b2)[:, 0]
        return 0.5 * jnp.sum(((y[idx] - out) / 0.1) ** 2) * (N / B) + 0.5 * jnp.sum(flat * flat)

    def body(flat, x):
        u, g = jax.value_and_grad(potential)(flat, x["idx"])
        noise = jax.random.normal(x["key"], flat.shape)
        return flat - x["rate"] * g + jnp.sqrt(2 * x["rate"]) * noise, u

    xs = {
        "idx": jnp.zeros((STEPS, B), jnp.int32),
        "key": jax.vmap(jax.random.PRNGKey)(jnp.arange(STEPS)),
        "rate": jnp.full(STEPS, 1e-4),
    }
    return jax.jit(lambda flat, xs: jax.lax.scan(body, flat, xs)).lower(jnp.zeros(161), xs)


def gates(lowered) -> int:
    """Selects over floating arrays and conditionals in a lowered program."""
    text = lowered.as_text()
    float_selects = sum(
        bool(re.search(r"tensor<\d[\dx]*xf\d+>", line.rsplit(",", 1)[-1]))  # the result type
        for line in re.findall(r"stablehlo\.select[^\n]*", text)
    )
    return float_selects + len(re.findall(r"stablehlo\.(case|if)\b", text))


def kernels_per_step(lowered) -> int:
    """Instructions run per iteration of the compiled loop body that holds the matrix products
    (free ones, parameters, constants, tuples, bitcasts, not counted)."""
    free = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}
    bodies, name = {}, None
    for line in lowered.compile().as_text().splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(1)
            bodies[name] = []
        elif name is not None and (op := re.search(r"=\s*\S+\s+([\w\-]+)\(", line)):
            bodies[name].append(op.group(1))
    loops = {k: v for k, v in bodies.items() if "fus" not in k and not k.startswith("wrapped")}
    body = max(loops.values(), key=lambda ops: (ops.count("dot"), len(ops)))
    return sum(op not in free for op in body)


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
            return {k: bdl.math.where(ok, new[k], state[k]) for k in new}, info

        return step_with_gate

    assert gates(_ours(gated)) > 0
