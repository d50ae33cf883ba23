"""Time one VAE training step (Algorithm 4 of "Bayesian Computation in Deep Learning") against hand-written loops of the same
model, in one process, per backend.

The step: a minibatch of B = 64 binarised 16 x 16 stroke images (N = 2000, ``models/vae.py``),
the dense encoder 256-ReLU-(2 x 4) giving q(z_i | x_i) = N(mu, softplus(rho)^2), one draw
z = mu + sigma * eps per image, the dense decoder 4-256-ReLU-256 giving Bernoulli logits, the ELBO
(N/B) sum_i [log p(x_i | z_i) - KL(q(z_i | x_i) || N(0, I))] (the KL in closed form, Algorithm 4's
line 5) and one Adam step (lr 1e-3, constant) on encoder and decoder together.

- ours: :class:`ppl_bdl.inference.vi.runner.VIRun` with ``guides.Amortized`` on
  ``models.vae.vae_model`` (what ``bdl.fit(..., method="vi")`` drives: the project's loop, with
  the epoch's minibatch indices and every step's loss read back), timed in ``steps(S)`` calls
  after a warm-up (compiled once);
- hand-written JAX: ``jax.jit`` of ``lax.scan`` over the S steps, optax adam, the minibatch
  gathered in the step;
- hand-written torch: a Python loop over ``torch.nn`` modules, ``loss.backward()``,
  ``torch.optim.Adam``, one intra-op thread (as ours on Pyro).

Each variant runs S steps per call; the calls are interleaved over ``--rounds`` rounds and the
best is kept (the machine may be shared), reported as ms per step, with the ratio ours / the
hand-written loop (target <= 1.3).

Usage::

    python benchmarks/vae_step.py                 # both backends
    python benchmarks/vae_step.py --backend numpyro --steps 300 --rounds 7
    taskset -c 1 python benchmarks/vae_step.py --clock cpu     # steadier on a shared machine
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ppl_bdl import guides
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.vi.runner import VIRun
from ppl_bdl.models import vae

N, B, SIZE, LATENT, HIDDEN, LR = 2000, 64, 16, 4, 256, 1e-3
PIXELS = SIZE * SIZE


#: The clocks ``--clock`` offers: wall time, or the process's CPU time (every thread's), which a
#: shared machine disturbs far less (pin the run to one core: ``taskset -c 1 python ...``).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved(runs: dict, steps: int, rounds: int, clock: str = "wall") -> dict:
    """ms per step of each variant: warmed up twice (ours compiles its first call, which starts
    the run, and its second, which goes on from a state), then timed in alternating rounds
    (best)."""
    now = CLOCKS[clock]
    for run in runs.values():
        run(steps)
        run(steps)
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = now()
            run(steps)
            best[name] = min(best[name], now() - start)
    return {name: 1e3 * best[name] / steps for name in runs}


def ours(backend: str, X: np.ndarray):
    encoder, decoder = vae.networks("dense", SIZE, LATENT, HIDDEN)
    model = vae.vae_model(decoder, LATENT, "bernoulli")
    setup = prepare(model(X), backend, "float32", 0)
    run_vi = VIRun(
        setup,
        0,
        guide=guides.Amortized(encoder, sites=["z"]),
        batch_size=B,
        lr=LR,
        num_steps=10**6,
        schedule="constant",
    )

    def run(steps):
        losses, failure = run_vi.steps(steps)
        assert failure is None and losses.shape == (steps,)

    return run


def _dense(rng, i: int, o: int):
    """He-normal weights and zero biases, float32 (the shipped networks' prior draws)."""
    return (rng.normal(size=(i, o)) * np.sqrt(2.0 / i)).astype(np.float32), np.zeros(o, np.float32)


def hand_jax(X: np.ndarray):
    import jax
    import jax.numpy as jnp
    import optax

    Xj = jnp.asarray(X.reshape(len(X), PIXELS), jnp.float32)
    rng = np.random.default_rng(0)
    params = [
        _dense(rng, PIXELS, HIDDEN),
        _dense(rng, HIDDEN, 2 * LATENT),
        _dense(rng, LATENT, HIDDEN),
        _dense(rng, HIDDEN, PIXELS),
    ]
    params = jax.tree_util.tree_map(jnp.asarray, params)
    tx = optax.adam(LR)

    def loss_fn(p, x, eps):
        (w1, b1), (w2, b2), (w3, b3), (w4, b4) = p
        out = jax.nn.relu(x @ w1 + b1) @ w2 + b2
        loc, scale = out[:, :LATENT], jax.nn.softplus(out[:, LATENT:])
        z = loc + scale * eps
        logits = jax.nn.relu(z @ w3 + b3) @ w4 + b4
        log_lik = jnp.sum(x * logits - jax.nn.softplus(logits), axis=-1)
        kl = jnp.sum(-jnp.log(scale) + 0.5 * (scale**2 + loc**2) - 0.5, axis=-1)
        return -(N / B) * jnp.sum(log_lik - kl)

    def step(carry, inputs):
        p, opt_state = carry
        idx, key = inputs
        x = Xj[idx]
        loss, g = jax.value_and_grad(loss_fn)(p, x, jax.random.normal(key, (B, LATENT)))
        updates, opt_state = tx.update(g, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), loss

    @jax.jit
    def chunk(carry, idx, keys):
        return jax.lax.scan(step, carry, (idx, keys))

    state = {"carry": (params, tx.init(params)), "key": jax.random.PRNGKey(0)}

    def run(steps):
        idx = jnp.asarray(np.stack([rng.permutation(N)[:B] for _ in range(steps)]), jnp.int32)
        state["key"], sub = jax.random.split(state["key"])
        state["carry"], losses = chunk(state["carry"], idx, jax.random.split(sub, steps))
        assert np.isfinite(np.asarray(losses)).all()

    return run


def hand_torch(X: np.ndarray):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    Xt = torch.as_tensor(X.reshape(len(X), PIXELS), dtype=torch.float32)
    encoder = torch.nn.Sequential(
        torch.nn.Linear(PIXELS, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 2 * LATENT)
    )
    decoder = torch.nn.Sequential(
        torch.nn.Linear(LATENT, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, PIXELS)
    )
    opt = torch.optim.Adam([*encoder.parameters(), *decoder.parameters()], lr=LR)
    rng = np.random.default_rng(0)

    def run(steps):
        losses = []
        for _ in range(steps):
            x = Xt[torch.as_tensor(rng.permutation(N)[:B])]
            out = encoder(x)
            loc, scale = out[:, :LATENT], F.softplus(out[:, LATENT:])
            logits = decoder(loc + scale * torch.randn_like(loc))
            log_lik = (x * logits - F.softplus(logits)).sum(-1)
            kl = (-torch.log(scale) + 0.5 * (scale**2 + loc**2) - 0.5).sum(-1)
            loss = -(N / B) * (log_lik - kl).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert torch.isfinite(torch.stack(losses)).all()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["numpyro", "pyro", "both"], default="both")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or process CPU time (steadier on a shared machine)",
    )
    args = parser.parse_args()
    X = vae.stroke_images(N, SIZE, "bernoulli", seed=0)
    print(
        f"VAE step: B={B}, {SIZE}x{SIZE} Bernoulli images, dense {PIXELS}-{HIDDEN}-{2 * LATENT} "
        f"encoder, {LATENT}-{HIDDEN}-{PIXELS} decoder; {args.steps} steps per call, best of "
        f"{args.rounds} interleaved rounds, {args.clock} clock"
    )
    backends = ["numpyro", "pyro"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if backend == "pyro":
            import torch

            torch.set_num_threads(1)  # fastest for small networks on a small, shared CPU
            anchor = ("hand-written torch", hand_torch(X))
        else:
            anchor = ("hand-written JAX", hand_jax(X))
        runs = dict([anchor, (f"ours ({backend})", ours(backend, X))])
        times = interleaved(runs, args.steps, args.rounds, args.clock)
        ratio = times[f"ours ({backend})"] / times[anchor[0]]
        cells = ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items())
        print(f"{backend}: {cells}; ratio {ratio:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
