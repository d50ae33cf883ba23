"""Time one training step of a score model (weighted denoising score matching under the VP SDE,
Song et al. 2021) against hand-written steps of the same objective, in one process, per backend.

The step: a minibatch of B = 128 points of a 2-D Gaussian mixture (N = 2000), t ~ U(t_min, 1),
z ~ N(0, I), x_t = a(t) x_0 + σ(t) z, the loss ½ mean ‖net([x_t, t]) + z‖² (λ(t) = σ(t)², the
network's output divided by σ(t)) and one Adam step (lr 1e-3, constant) on a 3-128-128-2 SiLU
MLP.

- ours: :class:`ppl_bdl.inference.diffusion.trainer.ScoreTrainer` (what ``bdl.diffusion.fit``
  drives: the project's loop, minibatch indices and every step's infos read back), timed in
  ``run(S)`` calls after a warm-up;
- hand-written JAX: ``jax.jit`` of ``lax.scan`` over the S steps, optax adam, the minibatch
  gathered in the step;
- hand-written torch: a Python loop, ``torch.optim.Adam``.

Each variant runs S steps per call; the calls are interleaved over ``--rounds`` rounds and the
best is kept, reported as ms per step with the ratio ours / hand-written.

Usage::

    python benchmarks/diffusion_step.py                 # both backends
    python benchmarks/diffusion_step.py --backend numpyro --steps 500 --rounds 7
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ppl_bdl import nn
from ppl_bdl.inference.diffusion import VPSDE
from ppl_bdl.inference.diffusion.trainer import ScoreTrainer
from ppl_bdl.models.ebm import gaussian_mixture_2d

N, B, LR, HIDDEN = 2000, 128, 1e-3, 128
SDE = VPSDE()
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved(runs: dict, steps: int, rounds: int, clock: str = "wall") -> dict:
    """ms per step of each variant: warmed up once, then timed in alternating rounds (best)."""
    now = CLOCKS[clock]
    for run in runs.values():
        run(steps)
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = now()
            run(steps)
            best[name] = min(best[name], now() - start)
    return {name: 1e3 * best[name] / steps for name in runs}


def ours(backend: str, X: np.ndarray, total: int):
    net = nn.MLP("s", [3, HIDDEN, HIDDEN, 2], activation="silu", prior=nn.he_normal())
    trainer = ScoreTrainer(
        net,
        X,
        sde=SDE,
        backend=backend,
        batch_size=B,
        num_steps=total,
        lr=LR,
        lr_schedule="constant",
    )

    def run(steps):
        trainer.run(steps)
        assert trainer.failure is None

    return run


def _dense(rng, i, o):
    return rng.normal(size=(i, o)).astype(np.float32) * np.sqrt(2.0 / i), np.zeros(o, np.float32)


def _coefficients(t, xp):
    """a(t) and σ(t) of the VP SDE."""
    log_a = -0.25 * t * t * (SDE.beta_max - SDE.beta_min) - 0.5 * t * SDE.beta_min
    return xp.exp(log_a), xp.sqrt(-xp.expm1(2.0 * log_a))


def hand_jax(X: np.ndarray):
    import jax
    import jax.numpy as jnp
    import optax

    Xj = jnp.asarray(X, jnp.float32)
    rng = np.random.default_rng(0)
    params = [_dense(rng, 3, HIDDEN), _dense(rng, HIDDEN, HIDDEN), _dense(rng, HIDDEN, 2)]
    params = jax.tree_util.tree_map(jnp.asarray, params)
    tx = optax.adam(LR)

    def loss(p, x0, t, z):
        a, s = _coefficients(t[:, None], jnp)
        h = jnp.concatenate([a * x0 + s * z, t[:, None]], axis=-1)
        h = jax.nn.silu(h @ p[0][0] + p[0][1])
        h = jax.nn.silu(h @ p[1][0] + p[1][1])
        out = h @ p[2][0] + p[2][1]
        return 0.5 * jnp.mean(jnp.sum((out + z) ** 2, axis=-1))

    def step(carry, inputs):
        p, opt_state = carry
        idx, key = inputs
        k_t, k_z = jax.random.split(key)
        t = jax.random.uniform(k_t, (B,), minval=SDE.t_min, maxval=1.0)
        z = jax.random.normal(k_z, (B, 2))
        value, g = jax.value_and_grad(loss)(p, Xj[idx], t, z)
        updates, opt_state = tx.update(g, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), value

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

    torch.manual_seed(0)
    Xt = torch.as_tensor(X, dtype=torch.float32)
    net = torch.nn.Sequential(
        torch.nn.Linear(3, HIDDEN),
        torch.nn.SiLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.SiLU(),
        torch.nn.Linear(HIDDEN, 2),
    )
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    rng = np.random.default_rng(0)

    def run(steps):
        losses = []
        for _ in range(steps):
            x0 = Xt[torch.as_tensor(rng.permutation(N)[:B])]
            t = SDE.t_min + (1.0 - SDE.t_min) * torch.rand(B, 1)
            z = torch.randn(B, 2)
            a, s = _coefficients(t, torch)
            out = net(torch.cat([a * x0 + s * z, t], dim=-1))
            loss = 0.5 * ((out + z) ** 2).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert torch.isfinite(torch.stack(losses)).all()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["numpyro", "pyro", "both"], default="both")
    parser.add_argument("--steps", type=int, default=300, help="steps per timed call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    X = gaussian_mixture_2d(N, seed=0).astype(np.float32)
    total = args.steps * (args.rounds + 2)
    print(
        f"score-model step (VP DSM): B={B}, MLP 3-{HIDDEN}-{HIDDEN}-2 SiLU, Adam; {args.steps} "
        f"steps per call, best of {args.rounds} interleaved rounds, {args.clock} clock"
    )
    backends = ["numpyro", "pyro"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if backend == "pyro":
            import torch

            torch.set_num_threads(1)  # fastest for small networks on a small, shared CPU
            anchor = "hand-written torch"
            runs = {anchor: hand_torch(X)}
        else:
            anchor = "hand-written JAX"
            runs = {anchor: hand_jax(X)}
        runs[f"ours ({backend})"] = ours(backend, X, total)
        times = interleaved(runs, args.steps, args.rounds, args.clock)
        ratio = times[f"ours ({backend})"] / times[anchor]
        cells = ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items())
        print(f"{backend}: {cells}; ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
