"""Hand-written loops of the same updates ours run, for the benchmarks to time ours against.

One multilayer perceptron per size (:data:`SIZES`: from the toy 8-50-1 regression net to the
784-1200-1200-10 classifier of Blundell et al. 2015), N(0, 1) priors on every weight, and per
method the update ours runs, written by hand the way a user of each library would:

- JAX: ``jax.jit`` of ``lax.scan`` over the steps, parameters as a dict of arrays, the minibatch
  gathered in the step from data on the device, the Gaussian noise drawn in the step from a key
  split in the carry, the potential returned per step (``ys``), optax's adam for VI;
- BlackJAX: its ``sgld`` and ``sghmc`` inside the same ``lax.scan`` (its SGHMC resamples the
  momentum every call and runs ``num_integration_steps`` leapfrog steps on one minibatch: timed
  per gradient evaluation);
- torch: a Python loop, ``torch.autograd.grad``, in-place updates, ``torch.optim.Adam`` for VI.

Each ``make_*`` returns ``run(steps)``, which runs ``steps`` steps and waits for the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.backends.numpyro.loop import chunk_header
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.loop.chunked_run import chunk_inputs
from ppl_bdl.inference.loop.driver import Rates, _loop_step, plan_run, run_chains
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, sgmcmc_transition
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.inference.vi.runner import VIRun


@dataclass(frozen=True)
class Size:
    """A network and its data: layer widths, activation, N, B, and for regression the noise."""

    layers: tuple[int, ...]
    activation: str
    n: int
    batch: int
    noise: float = 0.1

    @property
    def classifier(self) -> bool:
        return self.layers[-1] > 1

    @property
    def weights(self) -> int:
        return sum(a * b + b for a, b in zip(self.layers[:-1], self.layers[1:], strict=True))

    @property
    def sgld_step(self) -> float:
        """α small enough that every contender stays finite for thousands of steps."""
        return 1e-4 / self.n


SIZES = {
    "8-50-1": Size((8, 50, 1), "tanh", 100_000, 100),
    "13-50-1": Size((13, 50, 1), "relu", 500, 32, noise=0.5),
    "784-100-10": Size((784, 100, 10), "relu", 20_000, 128),
    "784-200-200-10": Size((784, 200, 200, 10), "relu", 20_000, 128),
    "784-400-400-10": Size((784, 400, 400, 10), "relu", 20_000, 128),
    "784-1200-1200-10": Size((784, 1200, 1200, 10), "relu", 20_000, 128),
}
SGHMC_DECAY = 0.1
VI_LR = 1e-3
BLACKJAX_LEAPFROG = 10


def make_data(size: Size, seed: int = 0):
    """Regression: a smooth function of the inputs plus noise. Classification: ten noisy
    prototypes scaled like MNIST pixels."""
    rng = np.random.default_rng(seed)
    d = size.layers[0]
    if size.classifier:
        prototypes = rng.uniform(0.0, 1.0, size=(size.layers[-1], d)) ** 3
        y = rng.integers(0, size.layers[-1], size=size.n)
        X = np.clip(prototypes[y] + 0.3 * rng.normal(size=(size.n, d)), 0.0, 1.0)
        return X.astype(np.float32), y.astype(np.int32)
    X = rng.normal(size=(size.n, d))
    y = np.sin(X @ (rng.normal(size=d) / math.sqrt(d))) + size.noise * rng.normal(size=size.n)
    return X.astype(np.float32), y.astype(np.float32)


def model(size: Size):
    """The DSL model of ``size`` (what ours fits)."""

    @bdl.model
    def mlp(X, y):
        f = nn.MLP(
            "net", list(size.layers), activation=size.activation, prior=dist.Normal(0.0, 1.0)
        ).sample()
        with bdl.plate("data", X.shape[0]) as idx:
            out = f(X[idx])
            if size.classifier:
                bdl.sample("y", dist.Categorical(logits=out), obs=y[idx])
            else:
                bdl.sample("y", dist.Normal(out[..., 0], size.noise), obs=y[idx])

    return mlp


def ours_loop(backend: str, method: str, bound, batch: int, step_size: float, kept: int = 10):
    """``run(steps)``: the loop ``bdl.fit`` runs for ``method`` on ``bound``, set up once (the
    model traced, the step compiled) and run for ``steps`` steps per call: the same transition,
    chunks, minibatch indices, kept draws (the last ``kept`` steps) and read-back as a fit,
    without the once-per-fit set-up and posterior."""
    setup = prepare(bound, backend, "float32", 0)
    plate = minibatch_plate(setup, batch)
    n = plate[1]
    start = np.random.default_rng(0).normal(size=(1, setup.layout.dim)) * 0.01
    if method == "vi":
        run_vi = VIRun(setup, 0, guide="meanfield", lr=VI_LR, batch_size=batch)

        def run(steps: int):
            run_vi.states = None
            assert run_vi.steps(steps)[1] is None

        return run
    options = {"momentum_decay": SGHMC_DECAY} if method == "sghmc" else {}
    config = SGMCMCConfig.build(method, step_size=step_size, batch_size=batch, **options)
    cache = {}

    def run(steps: int):
        if steps not in cache:
            keep = np.zeros(steps, bool)
            keep[-kept:] = True
            transition, data = sgmcmc_transition(setup, config, plate, steps)
            cache[steps] = transition, data, plan_run(keep, 1, setup.layout.dim)
        transition, data, plan = cache[steps]
        result = run_chains(
            setup.backend,
            transition,
            start,
            1,
            plan,
            data,
            lambda chain: EpochBatches(n, batch, [1, chain, 7]),
            method,
            Rates(step_size),
        )
        assert result.failure is None, result.failure

    def lower(steps: int):
        """Our CPU chunk program of ``steps`` steps, lowered (the JAX backend only)."""
        be = setup.backend
        transition, data = sgmcmc_transition(setup, config, plate, steps)
        runner = backend.compile_loop(driver_step(be, transition), transition.emit)
        with backend.scope(), backend.activate():
            state = transition.init(backend.random.key(0), backend.asarray(start[0]), data)
            xs = chunk_inputs(be, steps, steps, [EpochBatches(n, batch, 0)], False)
            inputs = (data, backend.asarray(step_size), backend.random.key(1))
            keep = np.zeros(steps, bool)
            keep[-kept:] = True
            header = chunk_header(keep, steps, 0, kept)
            return runner.fast.lower(
                state, xs, inputs, header, length=steps, num_rows=kept, trace=False
            )

    run.lower = lower
    return run


def driver_step(backend, transition):
    """The driver's loop step of one chain at a constant rate (what ``compile_loop`` gets)."""
    return _loop_step(backend, transition, False, None)


def _initial(size: Size, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        ((rng.normal(size=(a, b)) / math.sqrt(a)).astype(np.float32), np.zeros(b, np.float32))
        for a, b in zip(size.layers[:-1], size.layers[1:], strict=True)
    ]


def _indices(size: Size, steps: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, size.n, size=(steps, size.batch)).astype(np.int32)


# -- JAX ------------------------------------------------------------------------------------------
def _jax_potential(size: Size, X, y):
    import jax
    import jax.numpy as jnp

    act = jax.nn.relu if size.activation == "relu" else jnp.tanh
    scale = size.n / size.batch

    def nll(params, idx):
        x = X[idx]
        for i, (w, b) in enumerate(params):
            x = x @ w + b
            if i < len(params) - 1:
                x = act(x)
        if size.classifier:
            logp = jax.nn.log_softmax(x)
            return -jnp.take_along_axis(logp, y[idx][:, None], axis=1).sum() * scale
        return 0.5 * jnp.sum((y[idx] - x[:, 0]) ** 2) / size.noise**2 * scale

    def potential(params, idx):
        prior = sum(jnp.sum(v * v) for v in jax.tree_util.tree_leaves(params))
        return nll(params, idx) + 0.5 * prior

    return nll, potential


def _normal_like(key, tree):
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noise = [jax.random.normal(k, v.shape, v.dtype) for k, v in zip(keys, leaves, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, noise)


def make_jax(size: Size, method: str, data):
    """The hand-written ``jit(lax.scan)`` loop of ``method`` ("sgld", "sghmc", "vi")."""
    import jax
    import jax.numpy as jnp
    import optax

    X, y = (jnp.asarray(a) for a in data)
    nll, potential = _jax_potential(size, X, y)
    params = jax.tree_util.tree_map(jnp.asarray, _initial(size, np.random.default_rng(0)))
    alpha = size.sgld_step
    tmap = jax.tree_util.tree_map
    if method == "vi":
        tx = optax.adam(VI_LR)
        q0 = {"loc": params, "rho": tmap(lambda v: v * 0 - 5.0, params)}

        def loss(q, key, idx):
            scale = tmap(jax.nn.softplus, q["rho"])
            eps = _normal_like(key, q["loc"])
            w = tmap(lambda m, s, e: m + s * e, q["loc"], scale, eps)
            kl = sum(
                jnp.sum(-jnp.log(s) + 0.5 * (s * s + m * m) - 0.5)
                for m, s in zip(
                    jax.tree_util.tree_leaves(q["loc"]),
                    jax.tree_util.tree_leaves(scale),
                    strict=True,
                )
            )
            return nll(w, idx) + kl

        def body(carry, idx):
            q, opt, key = carry
            key, sub = jax.random.split(key)
            value, grads = jax.value_and_grad(loss)(q, sub, idx)
            updates, opt = tx.update(grads, opt, q)
            return (optax.apply_updates(q, updates), opt, key), value

        init = (q0, tx.init(q0), jax.random.PRNGKey(0))
    else:
        decay = SGHMC_DECAY

        def body(carry, idx):
            p, v, key = carry
            key, sub = jax.random.split(key)
            value, grads = jax.value_and_grad(potential)(p, idx)
            noise = _normal_like(sub, p)
            if method == "sgld":
                sd = math.sqrt(2 * alpha)
                p = tmap(lambda a, g, e: a - alpha * g + sd * e, p, grads, noise)
            else:
                sd = math.sqrt(2 * decay * alpha)
                v = tmap(lambda a, g, e: (1 - decay) * a - alpha * g + sd * e, v, grads, noise)
                p = tmap(lambda a, b: a + b, p, v)
            return (p, v, key), value

        init = (params, tmap(jnp.zeros_like, params), jax.random.PRNGKey(0))

    scan = jax.jit(lambda carry, idxs: jax.lax.scan(body, carry, idxs))
    run = _jax_runner(size, lambda idxs: scan(init, idxs))
    run.lower = lambda steps: scan.lower(init, jnp.asarray(_indices(size, steps)))
    return run


def _jax_runner(size: Size, call):
    import jax
    import jax.numpy as jnp

    cache = {}

    def run(steps: int):
        if steps not in cache:
            cache[steps] = jnp.asarray(_indices(size, steps))
        jax.block_until_ready(call(cache[steps]))

    return run


def make_blackjax(size: Size, method: str, data):
    """BlackJAX's ``sgld`` / ``sghmc`` in a ``jit(lax.scan)``; ``run(steps)`` runs ``steps``
    gradient evaluations (SGHMC: steps / BLACKJAX_LEAPFROG calls)."""
    import blackjax
    import jax
    import jax.numpy as jnp

    X, y = (jnp.asarray(a) for a in data)
    nll, potential = _jax_potential(size, X, y)
    params = jax.tree_util.tree_map(jnp.asarray, _initial(size, np.random.default_rng(0)))
    scale = size.n / size.batch

    def logprior(p):
        return -0.5 * sum(jnp.sum(v * v) for v in jax.tree_util.tree_leaves(p))

    def loglik_one(p, batch):  # blackjax sums the per-datum log-likelihoods over the minibatch
        idx = batch
        return -nll(p, idx[None]) / scale

    grad_estimator = blackjax.sgmcmc.gradients.grad_estimator(logprior, loglik_one, size.n)
    if method == "sgld":
        algo, per_call = blackjax.sgld(grad_estimator), 1
    else:
        per_call = BLACKJAX_LEAPFROG
        algo = blackjax.sghmc(grad_estimator, num_integration_steps=per_call, alpha=SGHMC_DECAY)

    def body(p, inputs):
        key, idx = inputs
        return algo.step(key, p, idx, size.sgld_step), None

    @jax.jit
    def call(idxs):
        calls = idxs[::per_call]
        keys = jax.random.split(jax.random.PRNGKey(0), calls.shape[0])
        return jax.lax.scan(body, params, (keys, calls))[0]

    return _jax_runner(size, call)


# -- torch ----------------------------------------------------------------------------------------
def make_torch(size: Size, method: str, data):
    """The hand-written torch loop of ``method``."""
    import torch

    X, y = torch.as_tensor(data[0]), torch.as_tensor(data[1])
    if size.classifier:
        y = y.long()
    gen = torch.Generator().manual_seed(0)
    act = torch.relu if size.activation == "relu" else torch.tanh
    scale = size.n / size.batch
    params = [torch.as_tensor(a) for pair in _initial(size, np.random.default_rng(0)) for a in pair]

    def nll(p, idx):
        x = X[idx]
        for i in range(0, len(p), 2):
            x = x @ p[i] + p[i + 1]
            if i < len(p) - 2:
                x = act(x)
        if size.classifier:
            return -torch.log_softmax(x, -1).gather(1, y[idx][:, None]).sum() * scale
        return 0.5 * ((y[idx] - x[:, 0]) ** 2).sum() / size.noise**2 * scale

    alpha = size.sgld_step
    if method == "vi":
        loc = [p.clone().requires_grad_() for p in params]
        rho = [torch.full_like(p, -5.0).requires_grad_() for p in params]
        opt = torch.optim.Adam(loc + rho, lr=VI_LR)

        def one_step(idx):
            s = [torch.nn.functional.softplus(r) for r in rho]
            w = [m + sd * torch.randn(m.shape, generator=gen) for m, sd in zip(loc, s, strict=True)]
            kl = sum(
                (-torch.log(sd) + 0.5 * (sd * sd + m * m) - 0.5).sum()
                for m, sd in zip(loc, s, strict=True)
            )
            loss = nll(w, idx) + kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        p = [t.clone().requires_grad_() for t in params]
        velocity = [torch.zeros_like(t) for t in params]

        def one_step(idx):
            loss = nll(p, idx) + 0.5 * sum((t * t).sum() for t in p)
            grads = torch.autograd.grad(loss, p)
            with torch.no_grad():
                for t, g, v in zip(p, grads, velocity, strict=True):
                    noise = torch.randn(t.shape, generator=gen)
                    if method == "sgld":
                        t.add_(-alpha * g + math.sqrt(2 * alpha) * noise)
                    else:
                        sd = math.sqrt(2 * SGHMC_DECAY * alpha)
                        v.mul_(1 - SGHMC_DECAY).add_(-alpha * g + sd * noise)
                        t.add_(v)

    cache = {}

    def run(steps: int):
        if steps not in cache:
            cache[steps] = torch.as_tensor(_indices(size, steps)).long()
        idxs = cache[steps]
        for t in range(steps):
            one_step(idxs[t])

    return run
