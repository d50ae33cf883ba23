"""Chains over devices: SGHMC draws per second on the DL-scale MLP against the number of devices.

On JAX's virtual CPU devices here (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, one
subprocess per N: JAX fixes the count when it starts), on GPUs where a machine has them
(``--platform gpu``). For the 784-200-200-10 ReLU classifier of :mod:`anchors` (N = 20,000,
B = 128; ``--size`` picks another), SGHMC, it times the loop ``bdl.fit`` runs (set up once, then run for ``steps`` steps
per call: the same transition, chunks, minibatch indices and kept draws as a fit, as
:func:`anchors.ours_loop` does for one chain) and reports:

- **sharding overhead on one device**: the same chains on ``device="cpu:0"`` (the plain loop)
  and on ``device=["cpu:0"]`` (the split program: a mesh of one device, the inputs placed on
  it, the chunk under ``shard_map``); target <= 5%;
- **weak scaling**: ``--per-device`` chains on each of 1, 2, 4 devices (the work per device
  fixed): draws per second, and efficiency = rate(n) / (n · rate(1));
- **strong scaling**: ``--total`` chains on 1, 2, 4 devices (the total work fixed): draws per
  second, speed-up and efficiency = speed-up / n.

A draw is one chain's step (SG-MCMC keeps one per step before thinning). Per-step time is (best
time at ``long`` − best at ``short``) / (long − short), as in :mod:`dl_scale`: set-up and
compilation cancel; variants are interleaved, each the best of ``--repeats``. Both clocks are
reported: wall-clock time, and the process's CPU time summed over its threads (the work done,
which other processes on a shared machine disturb far less than the wall clock; on virtual
devices, which share the cores, it is what splitting costs in extra work).

Virtual CPU devices share the machine's cores: on a machine with fewer cores than devices the
scaling numbers measure how the split program shares them (its overhead, the padding, XLA's
thread pool), not what separate devices give; the overhead on one device is meaningful anywhere.
The Ray workers' part (local Ray workers against one process) comes with the Ray executor.

Usage::

    python benchmarks/scale_out.py                       # 1, 2, 4 virtual CPU devices
    python benchmarks/scale_out.py --size 8-50-1 --devices 1 --repeats 7   # overhead, toy steps
    python benchmarks/scale_out.py --devices 1,2 --per-device 2 --total 4 --repeats 3
    python benchmarks/scale_out.py --platform gpu --devices 1,2,4,8   # on a multi-GPU machine
    python benchmarks/scale_out.py --torch-data 1,2      # torch: 1 and 2 gloo processes

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
from ppl_bdl.inference.driver import Rates, plan_run, run_chains
from ppl_bdl.inference.minibatch import EpochBatches
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.inference.sgmcmc import SGMCMCConfig, sgmcmc_transition

#: Steps of the short and the long run per size (a few seconds per variant on two cores).
LENGTHS = {"8-50-1": (1_000, 5_000), "784-100-10": (50, 250), "784-200-200-10": (20, 100)}
KEPT = 5


def sghmc_loop(size: anchors.Size, data, device, chains: int, backend: str = "numpyro",
               shard: str | None = None):  # fmt: skip
    """``run(steps)``: our SGHMC loop for ``chains`` chains on ``device`` (set up once)."""
    setup = prepare(anchors.model(size)(*data), backend, "float32", 0, device=device, shard=shard)
    plate = minibatch_plate(setup, size.batch)
    starts = np.random.default_rng(0).normal(size=(chains, setup.layout.dim)) * 0.01
    config = SGMCMCConfig.build("sghmc", step_size=size.sgld_step, batch_size=size.batch,
                                momentum_decay=anchors.SGHMC_DECAY)  # fmt: skip
    cache = {}

    def run(steps: int):
        if steps not in cache:
            keep = np.zeros(steps, bool)
            keep[-KEPT:] = True
            transition, arrays = sgmcmc_transition(setup, config, plate, steps)
            cache[steps] = transition, arrays, plan_run(keep, chains, setup.layout.dim)
        transition, arrays, plan = cache[steps]
        result = run_chains(setup.backend, transition, starts, 1, plan, arrays,
                            lambda c: EpochBatches(plate[1], size.batch, [1, c, 7]), "sghmc",
                            Rates(size.sgld_step))  # fmt: skip
        assert result.failure is None, result.failure

    return run


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
    return {(k, c): (best[k, long, c] - best[k, short, c]) / (long - short)
            for k in runs for c in ("wall", "cpu")}  # fmt: skip


def worker(count: int, per_device: int, total: int, repeats: int, platform: str,
           name: str) -> dict:  # fmt: skip
    """Measured in a process with ``count`` devices: chain-steps per second of each variant."""
    import jax

    size = anchors.SIZES[name]
    data = anchors.make_data(size)
    every = f"{'cuda' if platform == 'gpu' else 'cpu'}:*"
    runs = {}
    if count == 1:
        one = jax.devices()[0]
        first = f"{'cuda' if one.platform == 'gpu' else 'cpu'}:{one.id}"
        runs["plain"] = sghmc_loop(size, data, first, per_device)
        runs["mesh of one"] = sghmc_loop(size, data, [first], per_device)
        if total != per_device:
            runs["plain total"] = sghmc_loop(size, data, first, total)
    else:
        runs["weak"] = sghmc_loop(size, data, every, per_device * count)
        runs["strong"] = sghmc_loop(size, data, every, total)
    seconds = per_step(runs, repeats, LENGTHS[name])
    chains = {"plain": per_device, "mesh of one": per_device, "plain total": total,
              "weak": per_device * count, "strong": total}  # fmt: skip
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
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(max(count, 1)),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            cmd = [sys.executable, __file__, "--torch-worker", str(count), "--repeats",
                   str(args.repeats), "--size", args.size]  # fmt: skip
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate()[0] for p in procs]
        rates[count] = json.loads(outs[0].strip().splitlines()[-1])
    print(f"SGHMC on {args.size} (B = {anchors.SIZES[args.size].batch}), pyro, one chain, one "
          f"thread per process, {os.cpu_count()} cores: steps per second (wall clock; CPU "
          "clock of rank 0), against one plain process (no process group)")
    plain = rates[0]
    print(f"{'processes':>10} {'wall/s':>8} {'vs plain':>9} {'cpu/s':>8} {'vs plain':>9}")
    for count, r in sorted(rates.items()):
        label = "plain" if count == 0 else str(count)
        print(f"{label:>10} {r['wall']:>8.1f} {r['wall'] / plain['wall']:>9.2f} "
              f"{r['cpu']:>8.1f} {r['cpu'] / plain['cpu']:>9.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="1,2,4", help="device counts, comma-separated")
    parser.add_argument("--per-device", type=int, default=2, help="chains per device (weak)")
    parser.add_argument("--total", type=int, default=8, help="chains in all (strong)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--size", default="784-200-200-10", choices=sorted(LENGTHS))
    parser.add_argument("--torch-data", default="", help="torch: gloo process counts, e.g. 1,2")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--torch-worker", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_worker >= 0:
        print(json.dumps(torch_worker(args.torch_worker, args.repeats, args.size)))
        return
    if args.torch_data:
        torch_data(args)
        return
    if args.worker:
        rates = worker(args.worker, args.per_device, args.total, args.repeats, args.platform,
                       args.size)  # fmt: skip
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
        cmd = [sys.executable, __file__, "--worker", str(count), "--per-device",
               str(args.per_device), "--total", str(args.total), "--repeats", str(args.repeats),
               "--platform", args.platform, "--size", args.size]  # fmt: skip
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rates[count] = json.loads(out.stdout.strip().splitlines()[-1])
    report(rates, args)


def report(rates: dict, args) -> None:
    print(f"SGHMC on {args.size} (B = {anchors.SIZES[args.size].batch}), {args.platform}, "
          f"{os.cpu_count()} cores; draws (chain-steps) per second of wall-clock time, and per "
          "second of the process's CPU time (its threads together)")  # fmt: skip
    one = rates[1]
    for clock in ("wall", "cpu"):
        plain, mesh = one[f"plain {clock}"], one[f"mesh of one {clock}"]
        print(f"[{clock}] one device, {args.per_device} chains: plain loop {plain:.1f}/s, split "
              f"program on a mesh of one {mesh:.1f}/s: overhead {plain / mesh - 1:+.1%} "
              "(target <= 5%)")  # fmt: skip
    print("Wall clock: efficiency = draws/s over n x the one-device loop's (weak: same chains "
          "per device; strong: same chains in all).")  # fmt: skip
    print("CPU clock: draws per CPU-second over the one-device loop's with the same chains per "
          "device (weak) or in all (strong): 1.00 = splitting costs no extra work.")  # fmt: skip
    print(f"{'devices':>8} {'chains':>7} {'weak wall/s':>12} {'eff.':>6} {'cpu/s':>7} "
          f"{'work':>6}   {'chains':>7} {'strong wall/s':>14} {'speed-up':>9} {'eff.':>6} "
          f"{'cpu/s':>7} {'work':>6}")  # fmt: skip
    weak1 = {c: one[f"plain {c}"] for c in ("wall", "cpu")}
    strong1 = {c: one.get(f"plain total {c}", one[f"plain {c}"]) for c in ("wall", "cpu")}
    for count, r in sorted(rates.items()):
        weak = {c: r.get(f"weak {c}", weak1[c]) for c in ("wall", "cpu")}
        strong = {c: r.get(f"strong {c}", strong1[c]) for c in ("wall", "cpu")}
        speedup = strong["wall"] / strong1["wall"]
        print(f"{count:>8} {args.per_device * count:>7} {weak['wall']:>12.1f} "
              f"{weak['wall'] / (count * weak1['wall']):>6.2f} {weak['cpu']:>7.1f} "
              f"{weak['cpu'] / weak1['cpu']:>6.2f}   {args.total:>7} {strong['wall']:>14.1f} "
              f"{speedup:>9.2f} {speedup / count:>6.2f} {strong['cpu']:>7.1f} "
              f"{strong['cpu'] / strong1['cpu']:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
