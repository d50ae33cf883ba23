"""Time one step of the flow guide: ours on Pyro against the same step written by hand in torch.

The problem: a BNN regression ``1-H-1`` (tanh, N(0, 1) weights, ``sigma ~ HalfNormal(1)``) on
the sine data, full batch. The step: the flow guide's defaults (4 affine coupling layers with a
64-unit tanh network each, log-scales clamped softly to ±3, then an elementwise affine map; 8
particles), the ELBO's loss and gradient, Adam. The hand-written step is the loop a torch user
writes: the same coupling layers and masks, the BNN's log density batched over the particles,
``loss.backward()``, ``torch.optim.Adam``; at the same parameters and noise its loss equals ours
(checked before timing). Ours is timed through ``VIRun``, the object ``fit`` drives (the
compiled step, the chunk of steps, the loss read-back), without the set-up.

Per step: the best of ``--rounds`` timed runs of ``--steps`` steps, the variants interleaved;
the clock is the process's CPU time (torch on one thread), which a busy machine moves far less
than wall time. With ``--numpyro`` ours on NumPyro is timed too (the same model and guide in a
compiled ``lax.scan``), for the ratio between the backends.

Usage::

    python benchmarks/flow_step.py                  # sizes 1-16-1 (N=120) and 1-50-1 (N=500)
    python benchmarks/flow_step.py --numpyro --steps 300
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import ppl_bdl as bdl
from ppl_bdl.models import bnn, regression

#: (hidden units, data points) of the BNNs timed.
SIZES = ((16, 120), (50, 500))
LR, PARTICLES, LAYERS, FLOW_HIDDEN, MAX_LOG_SCALE = 1e-3, 8, 4, 64, 3.0


def make_problem(hidden: int, n: int):
    X, y = regression.make_sine_data(n=n)
    return X, y, bnn.make_bnn_regression(hidden=(hidden,))(X, y)


def ours(backend: str, bound):
    """``run(steps)`` of our flow step, and the ``VIRun`` (for the loss check)."""
    from ppl_bdl.inference.common import prepare
    from ppl_bdl.inference.vi.runner import VIRun

    vi = VIRun(prepare(bound, backend, "float32", 0), 0, guide="flow", num_steps=10**6, lr=LR)

    def run(steps: int):
        losses, failure = vi.steps(steps, chunk=steps)
        assert failure is None and losses.shape == (steps,)

    return run, vi


def hand_flow(X, y, hidden: int, initial: dict):
    """The hand-written torch step, from ``initial`` (our guide's initial parameters)."""
    import torch

    X, y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    dim = 3 * hidden + 2
    params = {
        k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in initial.items()
    }
    keep = [torch.tensor((np.arange(dim) + i) % 2 == 0, dtype=torch.float32) for i in range(LAYERS)]
    log_2pi = math.log(2 * math.pi)

    def potential(theta):  # -log p(y, θ) per particle, θ: (K, dim) unconstrained
        w1 = theta[:, :hidden].reshape(-1, 1, hidden)
        b1 = theta[:, hidden : 2 * hidden].unsqueeze(1)
        w2 = theta[:, 2 * hidden : 3 * hidden].reshape(-1, hidden, 1)
        b2, log_sigma = theta[:, 3 * hidden : 3 * hidden + 1], theta[:, -1]
        mean = (torch.tanh(X @ w1 + b1) @ w2).squeeze(-1) + b2
        sigma = torch.exp(log_sigma)
        resid = (y - mean) / sigma.unsqueeze(1)
        loglik = (-0.5 * resid**2).sum(1) - len(y) * (log_sigma + 0.5 * log_2pi)
        weights = theta[:, : 3 * hidden + 1]
        log_prior = -0.5 * (weights**2).sum(1) - 0.5 * (3 * hidden + 1) * log_2pi
        log_prior = log_prior + math.log(2.0) - 0.5 * log_2pi - 0.5 * sigma**2 + log_sigma
        return -(loglik + log_prior)

    def loss_at(eps):
        z = eps
        log_q = -0.5 * (eps * eps).sum(1) - 0.5 * dim * log_2pi
        for i in range(LAYERS):
            hid = torch.tanh((z * keep[i]) @ params[f"w1_{i}"] + params[f"b1_{i}"])
            shift, raw = (hid @ params[f"w2_{i}"] + params[f"b2_{i}"]).split(dim, dim=1)
            log_scale = MAX_LOG_SCALE * torch.tanh(raw / MAX_LOG_SCALE)
            move = 1.0 - keep[i]
            z = keep[i] * z + move * (z * torch.exp(log_scale) + shift)
            log_q = log_q - (move * log_scale).sum(1)
        scale = torch.nn.functional.softplus(params["rho"])
        theta = params["loc"] + scale * z
        log_q = log_q - torch.log(scale).sum()
        return (potential(theta) + log_q).mean()

    optimizer = torch.optim.Adam(list(params.values()), lr=LR)

    def run(steps: int):
        for _ in range(steps):
            eps = torch.randn(PARTICLES, dim)
            optimizer.zero_grad()
            loss = loss_at(eps)
            loss.backward()
            optimizer.step()

    return run, loss_at


def check_same_loss(vi, hand_loss) -> float:
    """Our loss and the hand-written one at our initial parameters and one noise draw."""
    import torch

    from ppl_bdl.backend_protocol import Batch

    backend = vi.setup.backend
    eps = torch.randn(PARTICLES, vi.guide.dim, generator=torch.Generator().manual_seed(1))
    with backend.scope(), backend.activate():
        params = {k: backend.asarray(v) for k, v in vi._initial.items()}
        ours_loss = float(vi.loss(params, eps, Batch(vi.density.data, None)))
    with torch.no_grad():
        hand = float(hand_loss(eps))
    assert abs(ours_loss - hand) < 1e-3 * (1 + abs(hand)), (ours_loss, hand)
    return ours_loss


def interleaved(runs: dict, steps: int, rounds: int) -> dict:
    """ms (process CPU time) per step of each variant, best of ``rounds``, interleaved."""
    for run in runs.values():
        run(steps)  # warm-up: traces and compiles
    best = dict.fromkeys(runs, math.inf)
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.process_time()
            run(steps)
            best[name] = min(best[name], time.process_time() - start)
    return {name: 1e3 * t / steps for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per variant")
    parser.add_argument("--numpyro", action="store_true", help="time ours on NumPyro too")
    args = parser.parse_args()
    bdl.backends.get("pyro").set_threads(1)
    print(f"flow guide: {LAYERS} coupling layers x {FLOW_HIDDEN} units, {PARTICLES} particles")
    print(
        "| BNN | N | hand-written torch | ours (Pyro) | ours/hand |"
        + " ours (NumPyro) |" * args.numpyro
    )
    for hidden, n in SIZES:
        X, y, bound = make_problem(hidden, n)
        run_ours, vi = ours("pyro", bound)
        run_hand, hand_loss = hand_flow(X, y, hidden, vi._initial)
        check_same_loss(vi, hand_loss)
        runs = {"hand": run_hand, "ours": run_ours}
        if args.numpyro:
            runs["numpyro"] = ours("numpyro", bound)[0]
        ms = interleaved(runs, args.steps, args.rounds)
        row = f"| 1-{hidden}-1 | {n} | {ms['hand']:.3f} | {ms['ours']:.3f} | **{ms['ours'] / ms['hand']:.2f}** |"
        print(row + (f" {ms['numpyro']:.3f} |" if args.numpyro else ""))


if __name__ == "__main__":
    main()
