"""End-to-end Bayesian image classification: LeNet-5 (or ResNet-20) fitted with cSGHMC and
mean-field VI through ``bdl.fit``, scored against a plain SGD network, and timed per step.

The task (no downloads): ``models.images.make_stroke_images``, 10 classes of 28x28 grey images
(a stroke at the class's angle, neighbouring classes 18° apart with a 7° jitter, so they overlap,
plus a blob shared by two classes, clutter, random contrast and pixel noise) with 10 % of the
labels replaced at random, train and test drawn alike. Accuracy tops out near 90 %, and a
network that fits its training labels is over-confident: calibration matters.

1. **Quality.** The same network, the same batch size and the same number of steps:

   - SGD: a hand-written loop (JAX for ``--backend numpyro``, torch for ``pyro``), momentum 0.9,
     cosine-annealed learning rate, on the MAP objective: the prior N(0, s_i²) as weight decay
     λ_i / N = 1 / (s_i² N), started from He-normal weights;
   - cSGHMC: ``bdl.fit(method="csghmc")``, ``--cycles`` cycles, ``--draws-per-cycle`` draws kept
     at the end of each (Zhang et al. 2020, Alg. 1), α_0 = ``--step-size`` / N, momentum decay
     0.1 (so α_0 N / 0.1 is SGD's effective learning rate ``--sgd-lr`` / (1 − 0.9) at its peak);
   - mean-field VI: ``bdl.fit(method="vi", guide="meanfield")``, the closed-form KL, Adam with a
     cosine-annealed learning rate, the guide's scales started at ``--vi-init-scale``.

   All three start from the same He-normal weights (SGD's start, ``init=`` / ``init_loc=``).

   The post-hoc baselines (``--methods map,mc_dropout,laplace,swag``, beside or instead of
   ``csghmc,vi``):

   - MAP (fit): SGD (MAP)'s run through ``bdl.fit`` (a one-member ensemble, momentum SGD on the
     same cosine schedule), the start of the two below;
   - MC dropout (Gal & Ghahramani 2016): LeNet-5 with Dropout of rate ``--dropout`` before each
     dense layer, the same SGD run with the masks on, ``--baseline-draws`` masks;
   - Laplace: the MAP's KFAC Laplace approximation over every layer (Ritter, Botev & Barber
     2018), scored by the linearised ("GLM") predictive (Immer, Korzepa & Bauer 2021), at the
     model's prior or (``--laplace-prior marglik``) its precision rescaled by the evidence;
   - SWAG (Maddox et al. 2019): ``--swag-steps`` more steps of momentum SGD from the MAP at the
     constant rate ``--swag-lr``, 20 iterates collected (rank 20).

   The Laplace and SWAG seconds are their own, after the MAP's. Together about 3 min on Pyro
   on a shared 2-core CPU (the MAP 37 s, MC dropout 44 s, Laplace 52 s, SWAG 15 s).

   Every fit uses one prior, N(0, (g s_He)²) per weight with s_He = √(2 / fan_in) and the gain
   g = ``--prior-gain`` (default 2; SGD's weight decay is this prior's), at temperature 1 (unless
   ``--temperature`` says otherwise; both printed with the results). The gain sets the regime: at
   g = 1 the MAP network is under-confident after 64 epochs and the posteriors more so; from
   g = 2 on SGD over-fits the noisy labels (docs/benchmarks.md has the sweep). Scores on the test
   set (``ppl_bdl.posterior.metrics``): accuracy, NLL (nats), Brier (summed over classes), ECE with 15
   equal-width bins of the top-class probability (Guo et al. 2017). Targets: each Bayesian fit
   within 1 point of SGD's accuracy, with lower ECE and NLL.

2. **Speed.** ms per step of our cSGHMC and VI steps, through ``bdl.fit`` (everything included:
   set-up, compilation, the loop, the posterior), against the same updates written by hand (the
   JAX loop for NumPyro, the torch loop for Pyro; ``image_loops.py``), as ``dl_scale.py`` does:
   (best time at ``--long`` steps − best at ``--short``) / (long − short), so set-up and
   compilation cancel. Target: ours / hand-written ≤ 1.3.

Defaults (about 10 min on NumPyro, 3 on Pyro, on a shared 2-core CPU): LeNet-5, N = 2000 training
and 2000 test images, 1000 steps of batch 128 (64 epochs) for every fit, 4 cycles of 250 steps with
5 draws each for cSGHMC, 20 draws from the VI guide; timing at 130 and 30 steps, best of
``--repeats``.

Usage::

    python benchmarks/image_bnn.py                                  # NumPyro, LeNet-5, CPU
    python benchmarks/image_bnn.py --backend pyro
    python benchmarks/image_bnn.py --backend both --skip-timing
    python benchmarks/image_bnn.py --backend pyro --skip-timing --methods map,mc_dropout,laplace,swag
    python benchmarks/image_bnn.py --net resnet20 --device cuda --train 50000 --steps 20000
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import image_loops as hand  # noqa: E402

import ppl_bdl as bdl  # noqa: E402
from ppl_bdl import nn  # noqa: E402
from ppl_bdl.models import images, vision  # noqa: E402
from ppl_bdl.posterior import metrics  # noqa: E402

NUM_BINS = 15
EXPLORATION = 0.8  # cSGHMC's default: the first 80 % of each cycle explores (no noise, no draws)
#: The post-hoc baselines ``--methods`` takes besides "csghmc" and "vi".
BASELINES = ("map", "mc_dropout", "laplace", "swag")
#: The Bayesian fits that the speed comparison times against a hand-written loop.
TIMED = ("csghmc", "vi")


def make_task(args):
    """Train and test sets of one draw of the stroke task (so they share its distribution)."""
    channels, size = (1, 28) if args.net == "lenet5" else (3, 32)
    X, y = images.make_stroke_images(
        n=args.train + args.test,
        channels=channels,
        size=size,
        label_noise=args.label_noise,
        seed=args.seed,
    )
    return (X[: args.train], y[: args.train]), (X[args.train :], y[args.train :])


def make_net(args, p: float | None = None):
    if args.net == "lenet5":
        prior = nn.he_normal(math.sqrt(2.0) * args.prior_gain)
        return vision.lenet5(prior=prior, p=p)
    if p is not None:
        raise SystemExit("--methods mc_dropout applies to LeNet-5 only")
    if args.prior_gain != 1.0:
        raise SystemExit("--prior-gain applies to LeNet-5 only (ResNet-20 has its Fixup priors)")
    return vision.resnet20(in_channels=3)


def he_start(args, net) -> dict:
    """He-normal weights and zero biases, whatever the prior's gain: every fit's start (a prior
    draw at gain 2 makes the logits ~2^5 times larger and the first steps diverge)."""
    scales = {k: s / args.prior_gain for k, s in prior_scales(net).items()}
    return hand.init_weights(net.sites(), scales, args.seed)


def prior_scales(net) -> dict:
    return {k: float(d.params["scale"]) for k, d in net.priors().items()}


def csghmc_plan(steps: int, cycles: int, per_cycle: int) -> tuple[int, int]:
    """(num_samples, thinning) for ``per_cycle`` draws at the end of each of ``cycles`` cycles of
    a run of exactly ``steps`` steps (no warmup: the exploration stages are it). cSGHMC runs
    ``num_samples * thinning / (1 - exploration)`` steps, so ``steps`` must split evenly."""
    sampling = steps * (1 - EXPLORATION) / cycles
    thinning = round(sampling / per_cycle)
    if abs(sampling - round(sampling)) > 1e-9 or thinning * per_cycle != round(sampling):
        raise SystemExit(
            f"--steps {steps} does not split into {cycles} cycles with a sampling stage of "
            f"{per_cycle} x an integer thinning each: use a multiple of "
            f"{round(cycles * per_cycle / (1 - EXPLORATION))}."
        )
    return cycles * per_cycle, thinning


def fit_options(args, method: str, steps: int, init, cycles=None, per_cycle=None) -> dict:
    """``bdl.fit`` options of a ``steps``-step run of ``method`` ("csghmc" or "vi") from the
    weights ``init`` (a dict of site values); ``cycles`` and ``per_cycle`` default to
    ``--cycles`` and ``--draws-per-cycle``."""
    cycles = args.cycles if cycles is None else cycles
    per_cycle = args.draws_per_cycle if per_cycle is None else per_cycle
    common = dict(
        batch_size=args.batch,
        device=args.device,
        seed=args.seed,
        progress=False,
        log_likelihood=False,
    )
    if method == "vi":
        return dict(
            common,
            method="vi",
            guide="meanfield",
            num_steps=steps,
            lr=args.vi_lr,
            schedule=args.vi_schedule,
            init_scale=args.vi_init_scale,
            num_samples=args.vi_draws,
            init_loc=init,
        )
    num_samples, thinning = csghmc_plan(steps, cycles, per_cycle)
    return dict(
        common,
        method="csghmc",
        step_size=args.step_size / args.train,
        momentum_decay=args.momentum_decay,
        temperature=args.temperature,
        num_cycles=cycles,
        num_warmup=0,
        num_samples=num_samples,
        thinning=thinning,
        num_chains=1,
        init=init,
    )


# -- quality --------------------------------------------------------------------------------------
def quality(args, backend: str, train, test) -> dict:
    """Test scores of SGD, cSGHMC and VI on ``backend``; name -> (metrics, seconds)."""
    (Xtr, ytr), (Xte, yte) = train, test
    net = make_net(args)
    scales = prior_scales(net)
    weights = he_start(args, net)
    steps = args.steps
    csghmc_plan(steps, args.cycles, args.draws_per_cycle)  # checks that the steps split evenly
    results = {}

    start = time.perf_counter()
    sgd, predict = (
        (hand.jax_sgd, hand.jax_predict)
        if backend == "numpyro"
        else (hand.torch_sgd, hand.torch_predict)
    )
    fitted, _ = sgd(
        args.net,
        Xtr,
        ytr,
        scales,
        weights,
        steps,
        args.batch,
        args.sgd_lr,
        0.9,
        args.device or "cpu",
        args.seed,
    )
    probs = predict(args.net, fitted, Xte)[None]
    results["SGD (MAP)"] = (scores(probs, yte), time.perf_counter() - start)

    results.update(baselines(args, backend, train, test, weights))
    model = vision.make_classifier(net)
    for label, method in (("cSGHMC", "csghmc"), ("MF-VI", "vi")):
        if method not in args.methods:
            continue
        start = time.perf_counter()
        options = dict(fit_options(args, method, steps, weights), backend=backend)
        post = bdl.fit(model(Xtr, ytr), **options)
        probs = post.predict(model(Xte)).per_draw["probs"]
        results[label] = (scores(probs, yte), time.perf_counter() - start)
    return results, steps


def map_options(args, steps: int, init) -> dict:
    """``bdl.fit`` options of SGD (MAP)'s run through ``bdl.fit``: momentum 0.9, the learning
    rate ``--sgd-lr`` of the mean loss (``--sgd-lr`` / N on the summed potential) annealed by a
    cosine, from the weights ``init``."""
    return dict(
        batch_size=args.batch,
        device=args.device,
        seed=args.seed,
        progress=False,
        log_likelihood=False,
        optimizer="sgd",
        momentum=0.9,
        lr=args.sgd_lr / args.train,
        schedule="cosine",
        decay=1e-3,
        num_steps=steps,
        init=init,
    )


def baselines(args, backend: str, train, test, weights) -> dict:
    """Test scores of the post-hoc baselines in ``--methods`` (:data:`BASELINES`); label ->
    (metrics, seconds). The MAP is one ``bdl.fit`` (a one-member ensemble) of SGD (MAP)'s run;
    the Laplace fits (KFAC over every layer, GLM predictive) and SWAG start from it and their
    seconds are their own, after it; MC dropout trains LeNet-5 with ``--dropout`` before each
    dense layer for the same steps."""
    (Xtr, ytr), (Xte, yte) = train, test
    wanted = [m for m in BASELINES if m in args.methods]
    model = vision.make_classifier(make_net(args))
    results = {}

    def timed(label, fit, fitted_model=model, pred_type="nn"):
        start = time.perf_counter()
        post = fit()
        pred = post.predict(fitted_model(Xte), pred_type=pred_type)
        results[label] = (scores(pred.per_draw["probs"], yte), time.perf_counter() - start)
        return post

    if set(wanted) & {"map", "laplace", "swag"}:
        options = dict(map_options(args, args.steps, weights), backend=backend)
        fitted = timed(
            "MAP (fit)",
            lambda: bdl.fit(model(Xtr, ytr), method="ensemble", num_members=1, **options),
        )
        if "map" not in wanted:
            del results["MAP (fit)"]
        mode = {k: v[0, 0] for k, v in fitted.samples.items()}
    if "mc_dropout" in wanted:
        dropout = vision.make_classifier(make_net(args, p=args.dropout))
        options = dict(map_options(args, args.steps, weights), backend=backend)
        timed(
            "MC dropout",
            lambda: bdl.fit(
                dropout(Xtr, ytr), method="mc_dropout", num_samples=args.baseline_draws, **options
            ),
            dropout,
        )
    if "laplace" in wanted:
        options = dict(map_options(args, 0, fitted), backend=backend)
        options.update(hessian="kron", num_samples=args.baseline_draws)
        if args.laplace_prior == "marglik":
            options["prior_precision"] = "marglik"
        timed(
            "Laplace",
            lambda: bdl.fit(model(Xtr, ytr), method="laplace", **options),
            pred_type="glm",
        )
    if "swag" in wanted:
        timed("SWAG", lambda: bdl.fit(model(Xtr, ytr), **swag_options(args, backend, mode)))
    return results


def swag_options(args, backend: str, init: dict) -> dict:
    """SWAG from the MAP ``init`` (Maddox et al. 2019, Sec. 4): ``--swag-steps`` of momentum SGD
    at the constant rate ``--swag-lr`` of the mean loss, collecting 20 iterates (rank 20)."""
    every = max(args.swag_steps // 20, 1)
    return dict(
        map_options(args, args.swag_steps, init),
        backend=backend,
        method="swag",
        schedule="constant",
        lr=args.swag_lr / args.train,
        swa_start=args.swag_steps - 20 * every,
        collect_every=every,
        rank=20,
        num_samples=args.baseline_draws,
    )


def scores(probs, y) -> dict:
    """``ppl_bdl.posterior.metrics``' scores of per-draw probabilities (what ``post.evaluate`` returns),
    plus the mean top-class probability (above the accuracy: over-confident)."""
    out = metrics.classification_metrics(probs, y, num_bins=NUM_BINS)
    out["confidence"] = float(probs.mean(axis=0).max(axis=-1).mean())
    return out


def print_quality(backend: str, results: dict, steps: int, args) -> None:
    print(
        f"\n== {args.net} on {backend}: {args.train} train / {args.test} test images, "
        f"{steps} steps of B={args.batch} each, prior {args.prior_gain} x He, "
        f"T={args.temperature} =="
    )
    print(
        f"  {'method':<10} {'accuracy':>8} {'NLL':>7} {'ECE':>7} {'Brier':>7} {'conf':>7} "
        f"{'time s':>7}"
    )
    for name, (m, seconds) in results.items():
        print(
            f"  {name:<10} {m['accuracy']:8.4f} {m['nll']:7.4f} {m['ece']:7.4f} "
            f"{m['brier']:7.4f} {m['confidence']:7.4f} {seconds:7.1f}"
        )
    base = results["SGD (MAP)"][0]
    for name in [n for n in results if n != "SGD (MAP)"]:
        m = results[name][0]
        checks = [
            ("accuracy >= SGD - 0.01", m["accuracy"] >= base["accuracy"] - 0.01),
            ("ECE < SGD", m["ece"] < base["ece"]),
            ("NLL < SGD", m["nll"] < base["nll"]),
        ]
        print(f"  {name:<10} " + ", ".join(f"{c}: {'pass' if ok else 'FAIL'}" for c, ok in checks))


# -- speed ----------------------------------------------------------------------------------------
def ours(args, backend: str, method: str, X, y):
    """``run(steps)``: one whole ``bdl.fit`` of exactly ``steps`` steps."""
    net = make_net(args)
    bound, start = vision.make_classifier(net)(X, y), he_start(args, net)

    def run(steps: int):  # one cycle, 2 draws: the timing's run is exactly ``steps`` long
        options = fit_options(args, method, steps, start, cycles=1, per_cycle=2)
        options.update(backend=backend, num_samples=2)
        bdl.fit(bound, **options)

    return run


def loop(args, backend: str, method: str, X, y):
    net = make_net(args)
    scales = prior_scales(net)
    weights = he_start(args, net)
    make = hand.jax_loop if backend == "numpyro" else hand.torch_loop
    settings = dict(
        lr=args.vi_lr,
        step_size=args.step_size / args.train,
        cycles=1,
        momentum_decay=args.momentum_decay,
    )
    runs = {}

    def run(steps: int):
        if steps not in runs:  # the cyclical schedule spans the run, as in ours
            runs[steps] = make(
                method,
                args.net,
                X,
                y,
                scales,
                weights,
                args.batch,
                dict(settings, total=steps),
                args.device or "cpu",
            )
        runs[steps](steps)

    return run


def per_step(runs: dict, short: int, long: int, repeats: int) -> dict:
    """ms per step of each ``run(steps)``, (best at ``long`` − best at ``short``) / (long −
    short), the variants' runs interleaved so a slow spell of the machine slows them alike."""
    best = {(name, n): math.inf for name in runs for n in (short, long)}
    for run in runs.values():  # warm up: imports, the anchors' compilation
        run(short)
        run(long)
    for _ in range(repeats):
        for name, run in runs.items():
            for n in (short, long):
                start = time.perf_counter()
                run(n)
                best[name, n] = min(best[name, n], time.perf_counter() - start)
    return {name: 1e3 * (best[name, long] - best[name, short]) / (long - short) for name in runs}


def speed(args, backend: str, X, y) -> None:
    anchor = "jax loop" if backend == "numpyro" else "torch loop"
    short, long = (10 * math.ceil(n / 10) for n in (args.short, args.long))
    print(
        f"\n== per step on {backend} ({args.net}, B={args.batch}, device "
        f"{args.device or 'default'}; ms/step, {long} - {short} steps, best of "
        f"{args.repeats}) =="
    )
    for method in [m for m in args.methods if m in TIMED]:
        runs = {
            anchor: loop(args, backend, method, X, y),
            f"ours {backend}": ours(args, backend, method, X, y),
        }
        times = per_step(runs, short, long, args.repeats)
        ratio = times[f"ours {backend}"] / times[anchor]
        print(
            f"  {method:<7} {anchor} {times[anchor]:8.2f}   ours {times[f'ours {backend}']:8.2f}"
            f"   ratio {ratio:5.2f}  (target <= 1.3: {'pass' if ratio <= 1.3 else 'FAIL'})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpyro", choices=["numpyro", "pyro", "both"])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: backend's)")
    parser.add_argument("--net", default="lenet5", choices=["lenet5", "resnet20"])
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=2_000)
    parser.add_argument("--label-noise", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=1000, help="steps of every fit")
    parser.add_argument("--sgd-lr", type=float, default=0.05)
    parser.add_argument(
        "--step-size",
        type=float,
        default=0.05,
        help="cSGHMC's α_0 times N (the learning rate of the mean loss)",
    )
    parser.add_argument("--momentum-decay", type=float, default=0.1)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--draws-per-cycle", type=int, default=5)
    parser.add_argument(
        "--prior-gain",
        type=float,
        default=2.0,
        help="the prior's scale in units of He's, sqrt(2 / fan_in)",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--vi-lr", type=float, default=1e-3)
    parser.add_argument("--vi-schedule", default="cosine", choices=["constant", "cosine"])
    parser.add_argument("--vi-init-scale", type=float, default=0.01)
    parser.add_argument("--vi-draws", type=int, default=20)
    parser.add_argument("--short", type=int, default=30)
    parser.add_argument("--long", type=int, default=130)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument(
        "--methods",
        default="csghmc,vi",
        help="fits to run: csghmc, vi and the baselines map, mc_dropout, laplace, swag",
    )
    parser.add_argument("--dropout", type=float, default=0.1, help="MC dropout's rate")
    parser.add_argument("--swag-steps", type=int, default=250, help="SWAG's steps after the MAP")
    parser.add_argument("--swag-lr", type=float, default=0.01, help="SWAG's rate of the mean loss")
    parser.add_argument("--baseline-draws", type=int, default=20, help="the baselines' draws")
    parser.add_argument(
        "--laplace-prior",
        default="model",
        choices=["model", "marglik"],
        help="Laplace's prior precision: the model's, or rescaled by the Laplace evidence",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.methods = args.methods.split(",")
    backends = ["numpyro", "pyro"] if args.backend == "both" else [args.backend]
    if "pyro" in backends:
        import torch

        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="could not trace")  # conv nets run eagerly on Pyro
    train, test = make_task(args)
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    for backend in backends:
        if not args.skip_quality:
            results, steps = quality(args, backend, train, test)
            print_quality(backend, results, steps, args)
        if not args.skip_timing:
            speed(args, backend, *train)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
