"""Time one EBM training step (Algorithm 3 of "Bayesian Computation in Deep Learning") against hand-written loops of the same
algorithm, in one process, per backend.

The step: B = 100 persistent chains taken from a first-in-first-out replay buffer of 1000 (each
restarted from uniform noise with probability 0.05), K = 20 SGLD steps on the inputs
(x ← x − α ∇_x E(x) + √(2α) ε, α = 0.01, Eq. 3.7), a data minibatch of B, the loss
mean E(x⁺) − mean E(x⁻) and one Adam step (lr 1e-3, constant) on the energy network, a
2-64-64-1 SiLU MLP; the data: 2000 points of a 2-D Gaussian mixture.

- ours: :class:`ppl_bdl.inference.ebm.trainer.EBMTrainer` (what ``bdl.ebm.fit`` drives: the project's
  loop, with minibatch indices and every step's infos read back), timed in ``run(S)`` calls
  after a warm-up (compiled once);
- hand-written JAX: ``jax.jit`` of ``lax.scan`` over the S steps, the K chain steps a
  ``lax.fori_loop`` (and a second variant with them unrolled in Python, as ours are), optax
  adam, the minibatch gathered in the step;
- hand-written torch: a Python loop, ``torch.autograd.grad`` for ∇_x E, ``torch.optim.Adam``.

Each variant runs S steps per call; the calls are interleaved over ``--rounds`` rounds and the
best is kept (the machine may be shared), reported as ms per step, with the ratio ours /
the fastest hand-written variant (target <= 1.3).

Usage::

    python benchmarks/ebm_step.py                 # both backends
    python benchmarks/ebm_step.py --backend numpyro --steps 300 --rounds 7
    taskset -c 1 python benchmarks/ebm_step.py --clock cpu     # steadier on a shared machine
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ppl_bdl import nn
from ppl_bdl.inference.ebm.trainer import EBMTrainer
from ppl_bdl.models.ebm import gaussian_mixture_2d

N, B, M, K, ALPHA, LR, REINIT, HIDDEN = 2000, 100, 1000, 20, 0.01, 1e-3, 0.05, 64


#: The clocks ``--clock`` offers: wall time, or the process's CPU time (every thread's), which a
#: shared machine disturbs far less (pin the run to one core: ``taskset -c 1 python ...``).
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
    net = nn.MLP("energy", [2, HIDDEN, HIDDEN, 1], activation="silu", prior=nn.he_normal())
    trainer = EBMTrainer(
        net,
        X,
        backend=backend,
        sampler="sgld",
        chain_steps=K,
        step_size=ALPHA,
        persistent=True,
        buffer_size=M,
        reinit=REINIT,
        batch_size=B,
        num_steps=total,
        lr=LR,
        lr_schedule="constant",
    )

    def run(steps):
        trainer.run(steps)
        assert trainer.failure is None

    return run


def hand_jax(X: np.ndarray, unroll: bool = False):
    import jax
    import jax.numpy as jnp
    import optax

    Xj = jnp.asarray(X, jnp.float32)
    low, high = Xj.min(0), Xj.max(0)
    rng = np.random.default_rng(0)

    def dense(i, o):
        return rng.normal(size=(i, o)).astype(np.float32) * np.sqrt(2.0 / i), np.zeros(
            o, np.float32
        )

    params = [dense(2, HIDDEN), dense(HIDDEN, HIDDEN), dense(HIDDEN, 1)]
    params = jax.tree_util.tree_map(jnp.asarray, params)

    def energy(p, x):
        h = jax.nn.silu(x @ p[0][0] + p[0][1])
        h = jax.nn.silu(h @ p[1][0] + p[1][1])
        return (h @ p[2][0] + p[2][1])[:, 0]

    grad_x = jax.grad(lambda x, p: energy(p, x).sum())
    tx = optax.adam(LR)

    def step(carry, inputs):
        p, opt_state, buffer = carry
        idx, key = inputs
        k_fresh, k_restart, k_chain = jax.random.split(key, 3)
        fresh = jax.random.uniform(k_fresh, (B, 2), minval=low, maxval=high)
        restart = jax.random.uniform(k_restart, (B, 1)) < REINIT
        x = jnp.where(restart, fresh, buffer[:B])

        def langevin(k, x):
            noise = jax.random.normal(jax.random.fold_in(k_chain, k), x.shape)
            return x - ALPHA * grad_x(x, p) + jnp.sqrt(2 * ALPHA) * noise

        if unroll:  # the K steps written out in Python, as our step has them
            for k in range(K):
                x = langevin(k, x)
        else:
            x = jax.lax.fori_loop(0, K, langevin, x)
        x_pos = Xj[idx]
        loss, g = jax.value_and_grad(lambda q: energy(q, x_pos).mean() - energy(q, x).mean())(p)
        updates, opt_state = tx.update(g, opt_state, p)
        p = optax.apply_updates(p, updates)
        return (p, opt_state, jnp.concatenate([buffer[B:], x])), loss

    @jax.jit
    def chunk(carry, idx, keys):
        return jax.lax.scan(step, carry, (idx, keys))

    buffer = jnp.asarray(rng.uniform(np.asarray(low), np.asarray(high), size=(M, 2)), jnp.float32)
    state = {"carry": (params, tx.init(params), buffer), "key": jax.random.PRNGKey(0)}

    def run(steps):
        idx = jnp.asarray(np.stack([rng.permutation(N)[:B] for _ in range(steps)]), jnp.int32)
        state["key"], sub = jax.random.split(state["key"])
        carry, losses = chunk(state["carry"], idx, jax.random.split(sub, steps))
        state["carry"] = carry
        assert np.isfinite(np.asarray(losses)).all()

    return run


def hand_torch(X: np.ndarray):
    import torch

    torch.manual_seed(0)
    Xt = torch.as_tensor(X, dtype=torch.float32)
    low, high = Xt.min(0).values, Xt.max(0).values
    net = torch.nn.Sequential(
        torch.nn.Linear(2, HIDDEN),
        torch.nn.SiLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.SiLU(),
        torch.nn.Linear(HIDDEN, 1),
    )
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    state = {"buffer": low + (high - low) * torch.rand(M, 2)}
    rng = np.random.default_rng(0)

    def run(steps):
        losses = []
        for _ in range(steps):
            idx = torch.as_tensor(rng.permutation(N)[:B])
            buffer = state["buffer"]
            fresh = low + (high - low) * torch.rand(B, 2)
            x = torch.where(torch.rand(B, 1) < REINIT, fresh, buffer[:B])
            for _ in range(K):
                x.requires_grad_(True)
                (g,) = torch.autograd.grad(net(x).sum(), x)
                x = (x - ALPHA * g + (2 * ALPHA) ** 0.5 * torch.randn_like(x)).detach()
            loss = net(Xt[idx]).mean() - net(x).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            state["buffer"] = torch.cat([buffer[B:], x])
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
    X = gaussian_mixture_2d(N, seed=0).astype(np.float32)
    total = args.steps * (args.rounds + 2)
    print(
        f"EBM step: B={B}, K={K} SGLD steps, buffer {M}, MLP 2-{HIDDEN}-{HIDDEN}-1; "
        f"{args.steps} steps per call, best of {args.rounds} interleaved rounds, "
        f"{args.clock} clock"
    )
    backends = ["numpyro", "pyro"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if backend == "pyro":
            import torch

            torch.set_num_threads(1)  # fastest for small networks on a small, shared CPU
            anchors = {"hand-written torch": hand_torch(X)}
        else:
            anchors = {
                "hand-written JAX (fori_loop)": hand_jax(X),
                "hand-written JAX (unrolled)": hand_jax(X, unroll=True),
            }
        runs = {**anchors, f"ours ({backend})": ours(backend, X, total)}
        times = interleaved(runs, args.steps, args.rounds, args.clock)
        ratio = times[f"ours ({backend})"] / min(times[name] for name in anchors)
        cells = ", ".join(f"{name} {ms:.3f} ms" for name, ms in times.items())
        print(f"{backend}: {cells}; ratio {ratio:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
