"""Beyond one device: draws per second of SGHMC and of an ensemble on the DL-scale MLP against
the number of devices, of one chain's minibatch split over them, and of local Ray workers.

On JAX's virtual CPU devices here (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, one
subprocess per N: JAX fixes the count when it starts), on GPUs where a machine has them
(``--platform gpu``). For the 784-200-200-10 ReLU classifier of :mod:`anchors` (N = 20,000,
B = 128; ``--size`` picks another) it times the loop ``bdl.fit`` runs (set up once, then run
for ``steps`` steps per call: the same transition, chunks, minibatch indices and kept draws as
a fit, as :func:`anchors.ours_loop` does for one chain): SGHMC's (kept: the last 5 steps), and
the ensemble's (``method="ensemble"``: each member's Adam steps on the potential, every step's
loss kept, the last position emitted, as :func:`ppl_bdl.inference.ensemble.run_ensemble` runs
it; a member is a chain of the same driver), and reports:

- **sharding overhead on one device**: SGHMC's chains on ``device="cpu:0"`` (the plain loop),
  on ``device=["cpu:0"]`` (a list of one device: placed as the plain name is, so the same
  loop), and with the split program's placement forced onto a mesh of that one device (the
  inputs placed on a ``jax.sharding.Mesh`` of one device with ``NamedSharding``s every chunk,
  what a fit over several devices does per chunk); target <= 5%;
- **weak scaling**: ``--per-device`` chains (members) on each of 1, 2, 4 devices (the work per
  device fixed): draws per second, and efficiency = rate(n) / (n · rate(1));
- **strong scaling**: ``--total`` chains (members) on 1, 2, 4 devices (the total work fixed):
  draws per second, speed-up and efficiency = speed-up / n;
- **data-parallel steps** (``shard="data"``): one SGHMC chain, each minibatch of B split over
  the devices (strong scaling of one chain's steps).

A draw is one chain's step (one member's step for an ensemble). Per-step time is (best time
at ``long`` − best at ``short``) / (long − short), as in :mod:`dl_scale`: set-up and
compilation cancel; variants are interleaved, each the best of ``--repeats``. Both clocks are
reported: wall-clock time, and the process's CPU time summed over its threads (the work done,
which other processes on a shared machine disturb far less than the wall clock; on virtual
devices, which share the cores, it is what splitting costs in extra work).

Virtual CPU devices share the machine's cores: on a machine with fewer cores than devices the
scaling numbers measure how the split program shares them (its overhead, the padding, XLA's
thread pool), not what separate devices give; the overhead on one device is meaningful anywhere.

``--ray numpyro`` (or ``pyro``): local Ray workers instead of devices (``ray.init(num_cpus=2)``,
workers at niceness 0). Each worker runs the same loop as above as a Ray task (one CPU each),
set up and timed in the worker, for its share of the chains; 1 worker runs them all, 2 workers
half each, side by side, and their rates add up. The loop in this process is the reference.
Every process runs one intra-op thread (torch; XLA keeps its own thread pool), as Ray gives a
task with ``num_cpus=1``.
A fit's fixed costs on Ray (starting Ray, a task's set-up and compilation, sending the data and
the draws back) are not in these rates: :mod:`ray_workers` measures them on whole fits.

Usage::

    python benchmarks/scale_out.py                       # 1, 2, 4 virtual CPU devices
    python benchmarks/scale_out.py --size 8-50-1 --devices 1 --repeats 7   # overhead, toy steps
    python benchmarks/scale_out.py --devices 1,2 --per-device 2 --total 4 --repeats 3
    python benchmarks/scale_out.py --platform gpu --devices 1,2,4,8   # on a multi-GPU machine
    python benchmarks/scale_out.py --torch-data 1,2      # torch: 1 and 2 gloo processes
    python benchmarks/scale_out.py --ray numpyro         # local Ray workers (1, 2)

``--torch-data``: one chain's SGHMC steps on torch with each minibatch split over 1, 2, ...
``torch.distributed`` gloo processes on the CPU (``shard="data"``, one thread each), against one
plain process (no process group). A group of one process isolates the data-parallel path's own
cost (the all-reduce is then skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import anchors
import numpy as np

from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.ensemble import EnsembleConfig, ensemble_transition
from ppl_bdl.inference.loop.driver import Rates, plan_run, run_chains
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, sgmcmc_transition
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.optim import unit_schedule

#: Steps of the short and the long run per size (a few seconds per variant on two cores).
LENGTHS = {"8-50-1": (1_000, 5_000), "784-100-10": (50, 250), "784-200-200-10": (20, 100)}
KEPT = 5
#: The ensemble members' Adam learning rate (the cost of a step does not depend on it).
ENSEMBLE_LR = 1e-3


def mesh_of_one(device: str):
    """A NumPyro backend on ``device`` whose loop inputs are placed on a mesh of that one
    device every chunk, as over several devices (a list of one device is placed plainly)."""
    from ppl_bdl.backends.numpyro.backend import NumPyroBackend
    from ppl_bdl.backends.numpyro.shard import Placement

    backend = NumPyroBackend(device=device)  # not the cached backend of ``device``
    backend._placement = Placement([backend._jax_device], "chains")
    return backend


def loop(
    size: anchors.Size,
    data,
    device,
    chains: int,
    method: str = "sghmc",
    backend="numpyro",
    shard: str | None = None,
):
    """``run(steps)``: our loop of ``method`` ("sghmc" or "ensemble") for ``chains`` chains
    (members) on ``device`` (set up once); ``backend`` a name or a backend object."""
    if isinstance(backend, str):
        setup = prepare(
            anchors.model(size)(*data), backend, "float32", 0, device=device, shard=shard
        )
    else:
        setup = prepare(anchors.model(size)(*data), backend, "float32", 0)
    plate = minibatch_plate(setup, size.batch)
    starts = np.random.default_rng(0).normal(size=(chains, setup.layout.dim)) * 0.01
    if method == "sghmc":
        config = SGMCMCConfig.build(
            "sghmc",
            step_size=size.sgld_step,
            batch_size=size.batch,
            momentum_decay=anchors.SGHMC_DECAY,
        )
        rates, trace, kept = Rates(size.sgld_step), False, KEPT
    else:
        config = EnsembleConfig.build(num_members=chains, batch_size=size.batch, lr=ENSEMBLE_LR)
        rates = Rates(config.optimizer.lr, unit_schedule(config.optimizer))
        trace, kept = True, 1  # every step's loss; the last position
    cache = {}

    def run(steps: int):
        if steps not in cache:
            keep = np.zeros(steps, bool)
            keep[-kept:] = True
            if method == "sghmc":
                transition, arrays = sgmcmc_transition(setup, config, plate, steps)
            else:
                transition, arrays = ensemble_transition(setup, config, plate)
            cache[steps] = transition, arrays, plan_run(keep, chains, setup.layout.dim)
        transition, arrays, plan = cache[steps]
        result = run_chains(
            setup.backend,
            transition,
            starts,
            1,
            plan,
            arrays,
            lambda c: EpochBatches(plate[1], size.batch, [1, c, 7]),
            method,
            rates,
            trace=trace,
        )
        assert result.failure is None, result.failure

    return run


def sghmc_loop(
    size: anchors.Size,
    data,
    device,
    chains: int,
    backend: str = "numpyro",
    shard: str | None = None,
):
    """``run(steps)``: our SGHMC loop for ``chains`` chains on ``device`` (set up once)."""
    return loop(size, data, device, chains, "sghmc", backend, shard)


def per_step(runs: dict, repeats: int, lengths: tuple[int, int]) -> dict:
    """Seconds per step of each ``run``, wall-clock and the process's CPU time (every thread):
    interleaved, the best of ``repeats`` at each length."""
    short, long = lengths
    for run in runs.values():  # compile both lengths
        run(short)
        run(long)
    best = {(k, n, c): float("inf") for k in runs for n in lengths for c in ("wall", "cpu")}
    for _ in range(repeats):
        for n in lengths:
            for k, run in runs.items():
                wall, cpu = time.perf_counter(), time.process_time()
                run(n)
                best[k, n, "wall"] = min(best[k, n, "wall"], time.perf_counter() - wall)
                best[k, n, "cpu"] = min(best[k, n, "cpu"], time.process_time() - cpu)
    return {
        (k, c): (best[k, long, c] - best[k, short, c]) / (long - short)
        for k in runs
        for c in ("wall", "cpu")
    }


def worker(count: int, per_device: int, total: int, repeats: int, platform: str, name: str) -> dict:
    """Measured in a process with ``count`` devices: chain-steps per second of each variant."""
    import jax

    size = anchors.SIZES[name]
    data = anchors.make_data(size)
    every = f"{'cuda' if platform == 'gpu' else 'cpu'}:*"
    runs, chains = {}, {}

    def add(key, n, device, method="sghmc", **kw):
        runs[key], chains[key] = loop(size, data, device, n, method, **kw), n

    if count == 1:
        one = jax.devices()[0]
        first = f"{'cuda' if one.platform == 'gpu' else 'cpu'}:{one.id}"
        add("plain", per_device, first)
        add("list of one", per_device, [first])
        add("mesh of one", per_device, None, backend=mesh_of_one(first))
        add("plain total", total, first)
        add("ens plain", per_device, first, "ensemble")
        add("ens plain total", total, first, "ensemble")
        add("data plain", 1, first)
    else:
        add("weak", per_device * count, every)
        add("strong", total, every)
        add("ens weak", per_device * count, every, "ensemble")
        add("ens strong", total, every, "ensemble")
        add("data", 1, every, shard="data")
    seconds = per_step(runs, repeats, LENGTHS[name])
    return {f"{k} {c}": chains[k] / s for (k, c), s in seconds.items()}


def torch_worker(processes: int, repeats: int, name: str) -> dict:
    """Measured in each of ``processes`` torch.distributed processes (0: one plain process, the
    traced step): one chain's steps per second, its minibatch split over the processes."""
    import torch

    torch.set_num_threads(1)  # one core per process: the work split, not the threads
    size = anchors.SIZES[name]
    data = anchors.make_data(size)
    if processes:  # "cpu:*": the CPU once per process, each step's minibatch split
        run = sghmc_loop(size, data, "cpu:*", 1, backend="pyro", shard="data")
    else:
        run = sghmc_loop(size, data, "cpu", 1, backend="pyro")
    seconds = per_step({"run": run}, repeats, LENGTHS[name])
    return {c: 1 / s for (_, c), s in seconds.items()}


def torch_data(args) -> None:
    """Data-parallel steps on torch: one plain process against 1, 2, ... gloo processes."""
    counts = [int(c) for c in args.torch_data.split(",")]
    rates = {}
    for count in [0] + counts:
        port = 29_500 + os.getpid() % 1000 + count
        procs = []
        for rank in range(max(count, 1)):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(max(count, 1)),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            cmd = [
                sys.executable,
                __file__,
                "--torch-worker",
                str(count),
                "--repeats",
                str(args.repeats),
                "--size",
                args.size,
            ]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate()[0] for p in procs]
        rates[count] = json.loads(outs[0].strip().splitlines()[-1])
    print(
        f"SGHMC on {args.size} (B = {anchors.SIZES[args.size].batch}), pyro, one chain, one "
        f"thread per process, {os.cpu_count()} cores: steps per second (wall clock; CPU "
        "clock of rank 0), against one plain process (no process group)"
    )
    plain = rates[0]
    print(f"{'processes':>10} {'wall/s':>8} {'vs plain':>9} {'cpu/s':>8} {'vs plain':>9}")
    for count, r in sorted(rates.items()):
        label = "plain" if count == 0 else str(count)
        print(
            f"{label:>10} {r['wall']:>8.1f} {r['wall'] / plain['wall']:>9.2f} "
            f"{r['cpu']:>8.1f} {r['cpu'] / plain['cpu']:>9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="1,2,4", help="device counts, comma-separated")
    parser.add_argument("--per-device", type=int, default=2, help="chains per device (weak)")
    parser.add_argument("--total", type=int, default=8, help="chains in all (strong)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--size", default="784-200-200-10", choices=sorted(LENGTHS))
    parser.add_argument("--torch-data", default="", help="torch: gloo process counts, e.g. 1,2")
    parser.add_argument("--ray", default="", help="local Ray workers on this backend")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--torch-worker", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_worker >= 0:
        print(json.dumps(torch_worker(args.torch_worker, args.repeats, args.size)))
        return
    if args.torch_data:
        torch_data(args)
        return
    if args.ray:
        ray_mode(args)
        return
    if args.worker:
        rates = worker(
            args.worker, args.per_device, args.total, args.repeats, args.platform, args.size
        )
        print(json.dumps(rates))
        return
    counts = [int(c) for c in args.devices.split(",")]
    if 1 not in counts:
        counts = [1] + counts
    rates = {}
    for count in counts:
        env = dict(os.environ, JAX_PLATFORMS=args.platform)
        if args.platform == "cpu":
            flags = env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}"
            env["XLA_FLAGS"] = flags.strip()
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(count))
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            str(count),
            "--per-device",
            str(args.per_device),
            "--total",
            str(args.total),
            "--repeats",
            str(args.repeats),
            "--platform",
            args.platform,
            "--size",
            args.size,
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rates[count] = json.loads(out.stdout.strip().splitlines()[-1])
    report(rates, args)


def report(rates: dict, args) -> None:
    print(
        f"{args.size} (B = {anchors.SIZES[args.size].batch}), {args.platform}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()}; draws (chain-steps, member "
        "steps) per second of wall-clock time, and per second of the process's CPU time (its "
        "threads together)"
    )
    one = rates[1]
    for clock in ("wall", "cpu"):
        plain = one[f"plain {clock}"]
        for variant in ("list of one", "mesh of one"):
            rate = one[f"{variant} {clock}"]
            print(
                f"[{clock}] SGHMC, one device, {args.per_device} chains: plain loop "
                f"{plain:.1f}/s, {variant} {rate:.1f}/s: overhead {plain / rate - 1:+.1%} "
                "(target <= 5%)"
            )
    print(
        "Wall clock: efficiency = draws/s over n x the one-device loop's (weak: same chains "
        "per device; strong: same chains in all)."
    )
    print(
        "CPU clock: draws per CPU-second over the one-device loop's with the same chains per "
        "device (weak) or in all (strong): 1.00 = splitting costs no extra work."
    )
    for title, prefix in (("SGHMC", ""), ("ensemble", "ens ")):
        print(f"\n{title}")
        print(
            f"{'devices':>8} {'chains':>7} {'weak wall/s':>12} {'eff.':>6} {'cpu/s':>7} "
            f"{'work':>6}   {'chains':>7} {'strong wall/s':>14} {'speed-up':>9} {'eff.':>6} "
            f"{'cpu/s':>7} {'work':>6}"
        )
        weak1 = {c: one[f"{prefix}plain {c}"] for c in ("wall", "cpu")}
        strong1 = {c: one[f"{prefix}plain total {c}"] for c in ("wall", "cpu")}
        for count, r in sorted(rates.items()):
            weak = {c: r.get(f"{prefix}weak {c}", weak1[c]) for c in ("wall", "cpu")}
            strong = {c: r.get(f"{prefix}strong {c}", strong1[c]) for c in ("wall", "cpu")}
            speedup = strong["wall"] / strong1["wall"]
            print(
                f"{count:>8} {args.per_device * count:>7} {weak['wall']:>12.1f} "
                f"{weak['wall'] / (count * weak1['wall']):>6.2f} {weak['cpu']:>7.1f} "
                f"{weak['cpu'] / weak1['cpu']:>6.2f}   {args.total:>7} {strong['wall']:>14.1f} "
                f"{speedup:>9.2f} {speedup / count:>6.2f} {strong['cpu']:>7.1f} "
                f"{strong['cpu'] / strong1['cpu']:>6.2f}"
            )
    print("\nSGHMC, one chain, each minibatch split over the devices (shard='data')")
    print(f"{'devices':>8} {'wall/s':>8} {'speed-up':>9} {'eff.':>6} {'cpu/s':>7} {'work':>6}")
    base = {c: one[f"data plain {c}"] for c in ("wall", "cpu")}
    for count, r in sorted(rates.items()):
        rate = {c: r.get(f"data {c}", base[c]) for c in ("wall", "cpu")}
        speedup = rate["wall"] / base["wall"]
        print(
            f"{count:>8} {rate['wall']:>8.1f} {speedup:>9.2f} {speedup / count:>6.2f} "
            f"{rate['cpu']:>7.1f} {rate['cpu'] / base['cpu']:>6.2f}"
        )


# -- local Ray workers ---------------------------------------------------------------------------
def task_rates(name: str, method: str, chains: int, repeats: int, backend: str) -> dict:
    """What a Ray task measures (or this process, for the in-process row): the loop of
    ``method`` for ``chains`` chains set up here, then its draws per second (wall, and this
    process's CPU time) as :func:`per_step` times them."""
    import ppl_bdl as bdl

    # One intra-op thread, what Ray gives a task with num_cpus=1 (OMP_NUM_THREADS=1), in this
    # process too: torch's second thread on a loaded 2-core machine cost 15x (docs/benchmarks.md)
    bdl.backends.get(backend).set_threads(1)
    size = anchors.SIZES[name]
    run = loop(size, anchors.make_data(size), "cpu", chains, method, backend)
    seconds = per_step({"run": run}, repeats, LENGTHS[name])
    return {c: chains / s for (_, c), s in seconds.items()}


def ray_mode(args) -> None:
    """The loops in this process and in 1 and 2 local Ray workers (tasks run side by side)."""
    os.environ.setdefault("RAY_worker_niceness", "0")  # as benchmarks/ray_workers.py
    import ray

    ray.cloudpickle.register_pickle_by_value(anchors)  # benchmarks/ is not importable there
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    task = ray.remote(task_rates).options(num_cpus=1)
    per, total = args.per_device, args.total
    print(
        f"{args.ray}, {args.size} (B = {anchors.SIZES[args.size].batch}), {os.cpu_count()} "
        f"cores, load average {os.getloadavg()}: draws (chain-steps, member steps) per "
        "second of each loop, set up once in its process (this one, or a Ray worker's); "
        "several workers: the sum of their rates (their tasks run side by side)"
    )
    for method in ("sghmc", "ensemble"):
        rates = {}
        for chains in dict.fromkeys((per, total)):
            rates["in process", chains] = task_rates(
                args.size, method, chains, args.repeats, args.ray
            )
        for workers, chains in dict.fromkeys(((1, per), (1, total), (2, 2 * per), (2, total))):
            shares = [len(g) for g in np.array_split(np.arange(chains), workers)]
            got = ray.get(
                [task.remote(args.size, method, n, args.repeats, args.ray) for n in shares]
            )
            rates[f"Ray, {workers} worker{'s' * (workers > 1)}", chains] = {
                c: sum(r[c] for r in got) for c in ("wall", "cpu")
            }
        print(f"\n{method}: {'variant':>16} {'chains':>7} {'wall/s':>8} {'cpu/s':>8}")
        for (label, chains), r in rates.items():
            print(f"{'':>9}{label:>16} {chains:>7} {r['wall']:>8.1f} {r['cpu']:>8.1f}")
        one_w, one_s = rates["Ray, 1 worker", per], rates["Ray, 1 worker", total]
        two_w, two_s = rates["Ray, 2 workers", 2 * per], rates["Ray, 2 workers", total]
        for clock in ("wall", "cpu"):
            print(
                f"{'':>9}[{clock}] 2 workers against 1: weak efficiency "
                f"{two_w[clock] / (2 * one_w[clock]):.2f}, strong speed-up "
                f"{two_s[clock] / one_s[clock]:.2f} (efficiency "
                f"{two_s[clock] / one_s[clock] / 2:.2f}); 1 worker against this process "
                f"({total} chains): {one_s[clock] / rates['in process', total][clock]:.2f}"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
