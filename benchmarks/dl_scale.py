"""Deep-learning scale: ours through ``bdl.fit`` against hand-written loops, per step, per device.

The 784-400-400-10 ReLU classifier of the MNIST literature (~0.48 M weights, N(0, 1) priors) on
synthetic MNIST-shaped data (N = 60,000, B = 128, ten classes of noisy prototypes), with SGLD, SGHMC
and mean-field VI:

- ours: ``bdl.fit(..., backend=numpyro | pyro, device=...)``, everything included (model trace,
  compilation, the loop, the posterior of the kept draws);
- the anchors, in the same process: a hand-written JAX loop (``jax.jit`` of ``lax.scan``, the
  minibatch gathered in the step from data on the device, optax adam for VI) and a hand-written
  torch loop (``torch.autograd.grad``, in-place updates, ``torch.optim.Adam`` for VI).

Per-step time is the difference of two run lengths over the difference of their steps, so
compilation and set-up cancel; each length is the best of ``--repeats`` runs. Ratios are printed
per device: ours (NumPyro) / hand-written JAX (target <= 1.2) and ours (Pyro) / hand-written
torch (target <= 1.3). ``--memory`` measures, in a fresh process, the peak memory of a fit that
keeps 100 draws of the 0.48 M weights (target: <= 2x the draws' size plus the data).

Usage::

    python benchmarks/dl_scale.py                       # every device present
    python benchmarks/dl_scale.py --devices cpu --short 40 --long 120 --repeats 2
    python benchmarks/dl_scale.py --memory
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
import time

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn

SIZES = [784, 400, 400, 10]
N, B = 60_000, 128
SGLD_STEP = 1e-6  # α for N = 6e4 (the gradient is ~N times a datum's)
SGHMC_STEP, SGHMC_DECAY = 1e-6, 0.1
VI_LR = 1e-3
KEPT = 10


def make_data(n: int = N, seed: int = 0):
    """Ten classes: fixed random 28x28 prototypes plus noise, scaled like MNIST pixels."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0.0, 1.0, size=(10, SIZES[0])) ** 3
    y = rng.integers(0, 10, size=n)
    X = np.clip(prototypes[y] + 0.3 * rng.normal(size=(n, SIZES[0])), 0.0, 1.0)
    return X.astype(np.float32), y.astype(np.int32)


@bdl.model
def classifier(X, y):
    f = nn.MLP("net", SIZES, activation="relu", prior=dist.Normal(0.0, 1.0)).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=y[idx])


def ours(backend: str, method: str, device: str, X, y):
    """``run(steps)``: a whole ``fit`` of ``steps`` steps (10 kept draws)."""
    options = dict(batch_size=B, progress=False, log_likelihood=False, device=device, seed=0)
    if method != "vi":
        options["init"] = "median"  # (uniform on [-2, 2] would saturate a 784-400-400 net)
    if method == "vi":
        options.update(method="vi", guide="meanfield", lr=VI_LR, num_samples=KEPT)
    elif method == "sgld":
        options.update(method="sgld", step_size=SGLD_STEP, num_chains=1, num_samples=KEPT)
    else:
        options.update(method="sghmc", step_size=SGHMC_STEP, momentum_decay=SGHMC_DECAY,
                       num_chains=1, num_samples=KEPT)  # fmt: skip
    bound = classifier(X, y)

    def run(steps: int):
        if method == "vi":
            bdl.fit(bound, backend=backend, num_steps=steps, **options)
        else:
            bdl.fit(bound, backend=backend, num_warmup=steps - KEPT, **options)

    return run


# -- hand-written JAX -----------------------------------------------------------------------------
def jax_loop(method: str, device: str, X, y):
    import jax
    import jax.numpy as jnp
    import optax

    dev = _jax_device(device)
    Xd, yd = jax.device_put(X, dev), jax.device_put(y, dev)
    rng = np.random.default_rng(0)
    shapes = [(a, b) for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]
    params = {}
    for i, (a, b) in enumerate(shapes):
        params[f"w{i}"] = jax.device_put(rng.normal(size=(a, b)).astype(np.float32) * 0.05, dev)
        params[f"b{i}"] = jax.device_put(np.zeros(b, np.float32), dev)

    def forward(p, x):
        for i in range(len(shapes)):
            x = x @ p[f"w{i}"] + p[f"b{i}"]
            if i < len(shapes) - 1:
                x = jax.nn.relu(x)
        return x

    def nll(p, idx):
        logp = jax.nn.log_softmax(forward(p, Xd[idx]))
        return -jnp.take_along_axis(logp, yd[idx][:, None], axis=1).sum() * (N / B)

    def potential(p, idx):
        return nll(p, idx) + 0.5 * sum(jnp.sum(v * v) for v in jax.tree_util.tree_leaves(p))

    if method == "vi":
        tx = optax.adam(VI_LR)
        state0 = {"loc": params, "rho": jax.tree_util.tree_map(lambda v: v * 0 - 5.0, params)}

        def loss(q, key, idx):
            leaves, tree = jax.tree_util.tree_flatten(q["loc"])
            keys = jax.random.split(key, len(leaves))
            eps = jax.tree_util.tree_unflatten(
                tree, [jax.random.normal(k, v.shape) for k, v in zip(keys, leaves, strict=True)]
            )
            scale = jax.tree_util.tree_map(jax.nn.softplus, q["rho"])
            w = jax.tree_util.tree_map(lambda m, s, e: m + s * e, q["loc"], scale, eps)
            kl = sum(jnp.sum(-jnp.log(s) + 0.5 * (s * s + m * m) - 0.5)
                     for m, s in zip(jax.tree_util.tree_leaves(q["loc"]),
                                     jax.tree_util.tree_leaves(scale), strict=True))  # fmt: skip
            return nll(w, idx) + kl

        def body(carry, idx):
            q, opt, key = carry
            key, sub = jax.random.split(key)
            value, g = jax.value_and_grad(loss)(q, sub, idx)
            updates, opt = tx.update(g, opt, q)
            return (optax.apply_updates(q, updates), opt, key), value

        init = (state0, tx.init(state0), jax.random.PRNGKey(0))
    else:
        decay = 0.0 if method == "sgld" else SGHMC_DECAY
        step = SGLD_STEP if method == "sgld" else SGHMC_STEP

        def body(carry, idx):
            p, v, key = carry
            key, sub = jax.random.split(key)
            value, g = jax.value_and_grad(potential)(p, idx)
            leaves, tree = jax.tree_util.tree_flatten(p)
            keys = jax.random.split(sub, len(leaves))
            noise = jax.tree_util.tree_unflatten(
                tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
            )
            if method == "sgld":
                p = jax.tree_util.tree_map(
                    lambda a, b, e: a - step * b + math.sqrt(2 * step) * e, p, g, noise
                )
            else:
                sd = math.sqrt(2 * decay * step)
                v = jax.tree_util.tree_map(lambda a, b, e: (1 - decay) * a - step * b + sd * e,
                                           v, g, noise)  # fmt: skip
                p = jax.tree_util.tree_map(lambda a, b: a + b, p, v)
            return (p, v, key), value

        init = (params, jax.tree_util.tree_map(jnp.zeros_like, params), jax.random.PRNGKey(0))

    @jax.jit
    def scan(carry, idxs):
        return jax.lax.scan(body, carry, idxs)

    def run(steps: int):
        idxs = jax.device_put(
            np.random.default_rng(1).integers(0, N, size=(steps, B)).astype(np.int32), dev
        )
        jax.block_until_ready(scan(init, idxs))

    return run


def _jax_device(device: str):
    import jax

    kind, _, index = device.partition(":")
    return jax.devices("gpu" if kind == "cuda" else kind)[int(index or 0)]


# -- hand-written torch ---------------------------------------------------------------------------
def torch_loop(method: str, device: str, X, y):
    import torch

    dev = torch.device(device)
    Xd, yd = torch.as_tensor(X, device=dev), torch.as_tensor(y, device=dev).long()
    g = torch.Generator(device=dev).manual_seed(0)
    params = []
    for a, b in zip(SIZES[:-1], SIZES[1:], strict=True):
        params += [torch.randn(a, b, generator=g, device=dev) * 0.05, torch.zeros(b, device=dev)]

    def forward(p, x):
        for i in range(0, len(p), 2):
            x = x @ p[i] + p[i + 1]
            if i < len(p) - 2:
                x = torch.relu(x)
        return x

    def nll(p, idx):
        logp = torch.log_softmax(forward(p, Xd[idx]), dim=-1)
        return -logp.gather(1, yd[idx][:, None]).sum() * (N / B)

    if method == "vi":
        loc = [p.clone().requires_grad_() for p in params]
        rho = [torch.full_like(p, -5.0).requires_grad_() for p in params]
        opt = torch.optim.Adam(loc + rho, lr=VI_LR)

        def one_step(idx):
            scale = [torch.nn.functional.softplus(r) for r in rho]
            w = [m + s * torch.randn(m.shape, generator=g, device=dev)
                 for m, s in zip(loc, scale, strict=True)]  # fmt: skip
            kl = sum((-torch.log(s) + 0.5 * (s * s + m * m) - 0.5).sum()
                     for m, s in zip(loc, scale, strict=True))  # fmt: skip
            loss = nll(w, idx) + kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        p = [t.clone().requires_grad_() for t in params]
        velocity = [torch.zeros_like(t) for t in params]
        step = SGLD_STEP if method == "sgld" else SGHMC_STEP
        decay = SGHMC_DECAY

        def one_step(idx):
            loss = nll(p, idx) + 0.5 * sum((t * t).sum() for t in p)
            grads = torch.autograd.grad(loss, p)
            with torch.no_grad():
                for t, gr, v in zip(p, grads, velocity, strict=True):
                    noise = torch.randn(t.shape, generator=g, device=dev)
                    if method == "sgld":
                        t.add_(-step * gr + math.sqrt(2 * step) * noise)
                    else:
                        v.mul_(1 - decay).add_(-step * gr + math.sqrt(2 * decay * step) * noise)
                        t.add_(v)

    def run(steps: int):
        idxs = torch.as_tensor(np.random.default_rng(1).integers(0, N, size=(steps, B)), device=dev)
        for t in range(steps):
            one_step(idxs[t])
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return run


# -- timing ---------------------------------------------------------------------------------------
def per_step(runs: dict, short: int, long: int, repeats: int) -> dict:
    """ms per step of each ``run(steps)``: (best time at ``long`` − best at ``short``) / (long −
    short), the variants' runs interleaved so a slow spell of the machine slows them alike."""
    best = {(name, n): math.inf for name in runs for n in (short, long)}
    for run in runs.values():
        run(short)  # warm up: imports, the anchors' compilation
    for _ in range(repeats):
        for name, run in runs.items():
            for n in (short, long):
                start = time.perf_counter()
                run(n)
                best[name, n] = min(best[name, n], time.perf_counter() - start)
    return {name: 1e3 * (best[name, long] - best[name, short]) / (long - short) for name in runs}


def devices(asked: str | None) -> list[str]:
    if asked:
        return asked.split(",")
    found = ["cpu"]
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            found.append("cuda")
    return found


def memory_probe() -> None:
    """In this (fresh) process: peak memory of a fit keeping 100 draws, against its parts."""
    import resource

    X, y = make_data()
    bound = classifier(X, y)
    bdl.fit(bound, backend="numpyro", method="sgld", step_size=SGLD_STEP, batch_size=B,
            num_warmup=2, num_samples=2, num_chains=1, init="median", progress=False,
            log_likelihood=False)  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    post = bdl.fit(bound, backend="numpyro", method="sgld", step_size=SGLD_STEP, batch_size=B,
                   num_warmup=10, num_samples=100, num_chains=1, init="median",
                   progress=False, log_likelihood=False)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    draws = sum(v.nbytes for v in post.samples.values()) / 2**20
    data = (X.nbytes + y.nbytes) / 2**20
    print(f"kept draws {draws:.0f} MB, data {data:.0f} MB; peak memory before the fit "
          f"{before:.0f} MB, after {after:.0f} MB: the fit added {after - before:.0f} MB "
          f"({(after - before) / draws:.2f}x the draws; target <= 2x the draws plus the data, "
          f"{2 * draws + data:.0f} MB)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default=None, help="e.g. cpu,cuda (default: all present)")
    parser.add_argument("--methods", default="sgld,sghmc,vi")
    parser.add_argument("--short", type=int, default=50)
    parser.add_argument("--long", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="measure a fit's peak memory")
    parser.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        return memory_probe()
    if args.memory:
        subprocess.run([sys.executable, __file__, "--memory-probe"], check=True)
        return None
    X, y = make_data()
    installed = bdl.backends.available()
    for device in devices(args.devices):
        for method in args.methods.split(","):
            runs = {}
            if "numpyro" in installed:
                runs["jax loop"] = jax_loop(method, device, X, y)
                runs["ours numpyro"] = ours("numpyro", method, device, X, y)
            if "pyro" in installed:
                runs["torch loop"] = torch_loop(method, device, X, y)
                runs["ours pyro"] = ours("pyro", method, device, X, y)
            times = per_step(runs, args.short, args.long, args.repeats)
            print(f"\n== {method} on {device} (784-400-400-10, N={N}, B={B}; ms/step) ==")
            for name, ms in times.items():
                print(f"  {name:<14} {ms:8.3f}")
            if "jax loop" in times:
                ratio = times["ours numpyro"] / times["jax loop"]
                print(f"  ours/jax loop   {ratio:6.2f}   target <= 1.2")
            if "torch loop" in times:
                ratio = times["ours pyro"] / times["torch loop"]
                print(f"  ours/torch loop {ratio:6.2f}   target <= 1.3")
    return None


if __name__ == "__main__":
    main()
