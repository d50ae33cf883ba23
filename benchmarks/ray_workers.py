"""Draws per second of SGHMC on the 13-50-1 BNN (``anchors.SIZES``) run in this process, and as
Ray tasks on a local Ray with 1 and with 2 workers; and the fixed costs of a Ray fit (starting
Ray, the first tasks in fresh workers, sending the data and the draws).

Every fit is a whole ``bdl.fit`` (the model traced, the step compiled, the draws replayed and the
log-likelihood computed), timed as a user sees it; each variant runs ``--repeats`` times after one
untimed run (the first Ray run is timed apart: fresh workers import the backend), best time kept
(the machine may be shared). Beside the wall time, the CPU seconds of each fit, of this process
and of a local Ray's processes (its workers and daemons): what a fit costs whatever else loads
the machine, and on its critical path (this process's plus the busiest other process's: the
wall time with a free core for each process, which a machine shared with other work does not
give, since Linux's autogroup scheduling shares the CPU between sessions, not processes). Ray's
draws are checked equal to the in-process run's.

Run: ``python benchmarks/ray_workers.py [--backends pyro,numpyro] [--chains 4] [--samples 500]``
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
import warnings

# One thread per process, set before torch starts: a Ray task with num_cpus=1 gets
# OMP_NUM_THREADS=1 from Ray, and the run in this process must not get more (on a busy 2-core
# machine torch's second thread makes the in-process run over ten times slower, not faster).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import anchors  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402

import ppl_bdl as bdl  # noqa: E402
from ppl_bdl.posterior.chains import detach  # noqa: E402

# The model is a closure over an anchors.Size; Ray's workers cannot import benchmarks/.
ray.cloudpickle.register_pickle_by_value(anchors)

SIZE = anchors.SIZES["13-50-1"]


def _fit(backend, bound, args, executor=None, **kw):
    with warnings.catch_warnings():  # a BNN's weights: R-hat across chains is large, and said
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        start, cpu = time.perf_counter(), _cpu_seconds()
        post = bdl.fit(
            bound,
            backend=backend,
            method="sghmc",
            num_warmup=args.warmup,
            num_samples=args.samples,
            num_chains=args.chains,
            seed=0,
            step_size=1e-4 / SIZE.n,
            batch_size=SIZE.batch,
            progress=False,
            executor=executor,
            **kw,
        )
        np.asarray(post.log_likelihood["y"])
        after = _cpu_seconds()
        used = {pid: seconds - cpu.get(pid, 0.0) for pid, seconds in after.items()}
        here = used.pop(os.getpid())
        # what the fit would take with a free core per process: this process's work plus that
        # of the busiest other process (Ray's tasks run side by side)
        CPU.append((here + sum(used.values()), here + max(used.values(), default=0.0)))
        return post, time.perf_counter() - start


#: CPU seconds of each fit by ``_fit``, in order: (in all, on the critical path); see
#: _cpu_seconds.
CPU: list[tuple[float, float]] = []


def _cpu_seconds() -> dict[int, float]:
    """CPU seconds used so far by this process and every live process under it (a local Ray's
    daemons and workers), from /proc (Linux): the work of a fit whatever else loads the
    machine, where wall time is not."""
    ticks, parent, used = os.sysconf("SC_CLK_TCK"), {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    mine, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    return {pid: used[pid] for pid in mine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="pyro,numpyro")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    X, y = anchors.make_data(SIZE)
    bound = anchors.model(SIZE)(X, y)

    # The machine may be shared: its load says how many cores these timings really had.
    print(f"cores: {os.cpu_count()}; load average (1, 5, 15 min): {os.getloadavg()}")
    # Ray starts its workers at niceness 15, so that on a busy machine they yield to everything
    # else (the in-process run included): timings of both at the same priority, unless asked.
    os.environ.setdefault("RAY_worker_niceness", "0")
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    print(f"ray.init(num_cpus=2): {time.perf_counter() - start:.2f} s")
    blob = ray.cloudpickle.dumps(bound)
    start = time.perf_counter()
    ray.get(ray.put(bound))
    print(
        f"the bound model pickled: {len(blob) / 1e3:.0f} kB; ray.put + get: "
        f"{1e3 * (time.perf_counter() - start):.1f} ms"
    )

    draws = args.chains * args.samples
    print(
        f"\nSGHMC, {SIZE.layers} BNN, N={SIZE.n}, B={SIZE.batch}: {args.chains} chains x "
        f"({args.warmup} warmup + {args.samples} kept) steps; draws/s = kept draws / wall time "
        "of the whole fit"
    )
    for backend in args.backends.split(","):
        variants = {
            "in process": None,
            "Ray, 1 worker": bdl.RayExecutor(chains_per_task=args.chains),
            "Ray, 2 workers": bdl.RayExecutor(chains_per_task=-(-args.chains // 2)),
        }
        best, first, cpu = {}, {}, {}
        for name, executor in variants.items():
            post, first[name] = _fit(backend, bound, args, executor)
            CPU.clear()
            if name == "in process":
                reference = post
            else:
                # bit for bit on Pyro (its chains run one after another); on NumPyro a task's
                # chains run side by side in one XLA program, whose sums over a batch of 2 chains
                # may round otherwise than over 4 (measured: at most 1.2e-7 after
                # 1000 steps, the same as two groups of 2 in one process)
                gap = max(
                    float(np.max(np.abs(post.samples[k] - reference.samples[k])))
                    for k in reference.samples
                )
                print(f"[{backend}] {name}: largest difference to the in-process draws: {gap:.1e}")
                assert gap < 1e-2, f"{name}: draws differ from the in-process run by {gap}"
            best[name] = min(_fit(backend, bound, args, executor)[1] for _ in range(args.repeats))
            cpu[name] = min(CPU)
            print(
                f"[{backend}] {name}: {best[name]:.2f} s, {cpu[name][0]:.2f} CPU s (first run "
                f"{first[name]:.2f} s)",
                flush=True,
            )
        part = detach(_fit(backend, bound, args, chain_ids=list(range(-(-args.chains // 2))))[0])
        print(f"\n[{backend}] a task's posterior pickled: {len(pickle.dumps(part)) / 1e6:.1f} MB")
        here = best["in process"]
        for name, seconds in best.items():
            print(
                f"[{backend}] {name:15s} {seconds:7.2f} s  {draws / seconds:6.0f} draws/s  "
                f"x{here / seconds:.2f} of in process  (first run {first[name]:.2f} s)  "
                f"CPU: {cpu[name][0]:6.2f} s in all, {cpu[name][1]:6.2f} s on the critical path "
                f"(this process + the busiest other): {draws / cpu[name][1]:6.0f} draws/s with "
                "a free core per process"
            )
        tiny = argparse.Namespace(**dict(vars(args), warmup=10, samples=10))
        for name in ("in process", "Ray, 1 worker"):
            _fit(backend, bound, tiny, variants[name])
            CPU.clear()
            seconds = min(_fit(backend, bound, tiny, variants[name])[1] for _ in range(3))
            print(
                f"[{backend}] a fit of 10+10 steps, {name:13s}: {seconds:.2f} s, "
                f"{min(CPU)[0]:.2f} CPU s"
            )
    print(f"\nload average at the end (1, 5, 15 min): {os.getloadavg()}")
    ray.shutdown()


if __name__ == "__main__":
    main()
