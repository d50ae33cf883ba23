"""The SG-MCMC driver: minibatch gradients, step-size schedules, chains, warmup, thinning.

One driver runs every registered SG-MCMC kernel on every backend. It builds the minibatch
gradient of the potential Ũ(θ) of the chapter's Eq. 2.8 from the model, evaluates the step-size
schedule, and runs the kernel's steps in a compiled loop (:meth:`Backend.compile_loop`): on
NumPyro one jitted ``lax.scan`` per chunk of steps with the chains vectorised; on Pyro a lean
torch loop, one chain after another.

Chain c uses its own random key (from ``seed`` and c) and its own minibatch order, so the same
seed gives the same draws, and a chain's draws do not depend on how many chains run beside it.

A kernel factory may declare the keyword settings ``num_steps`` (T, the steps of the whole run),
``num_cycles`` (M) and ``exploration`` (β); the driver supplies the first two. A factory that takes
``exploration`` is cyclical with an exploration stage (cSGLD, cSGHMC): its step size follows the
cyclical schedule, draws are kept only in sampling stages, and the run lengthens so that
``num_samples`` draws are kept after ``num_warmup`` steps.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, NamedTuple

import numpy as np

from .. import prefetch
from ..errors import ConfigError, InferenceError
from ..layout import make_potential, make_site_potential
from ..schedules import SCHEDULES, check_exploration, make_schedule, sampling_stage_mask
from .chunks import chunks_ahead, run_ahead
from .common import Setup, build_posterior, initial_positions
from .minibatch import EpochBatches, minibatch_plate

#: Keyword settings a kernel factory may declare; the driver fills them in.
DRIVER_SUPPLIED = ("num_steps", "num_cycles")
#: Floats of positions (and pre-drawn normals) per chain-step of a compiled chunk: bounds its memory.
CHUNK_FLOATS = 16_000_000
MAX_CHUNK = 1000
#: Data (bytes) from which a chunk's minibatch rows are gathered in bulk before its loop: about a
#: core's L2 cache. Below it the rows are in cache and gathering them in the step is cheaper
#: (4% on the benchmark's BNN at 0.4 MB); above it the step's own gathers wait on memory (at
#: 3.6 MB bulk gathers make the step 10% faster, at 36 MB 22%).
GATHER_IN_BULK_BYTES = 1_000_000


def chain_seed(seed: int, chain: int) -> int:
    """The integer seed of chain ``chain`` (its random key and its minibatch order)."""
    return int(seed) * 1_000_003 + int(chain)


def run_sgmcmc(
    setup: Setup,
    entry,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int,
    thinning: int,
    seed: int,
    init: Any,
    progress: bool = False,
    step_size: float | None = None,
    batch_size: int | None = None,
    schedule: str | None = None,
    num_cycles: int = 4,
    decay_offset: float = 1.0,
    decay_power: float = 0.55,
    chunk_size: int | None = None,
    **kernel_options: Any,
):
    """Run the SG-MCMC kernel of registry ``entry`` on a prepared model; return a Posterior.

    Parameters
    ----------
    step_size : float
        α_0 (the learning rate η for SGHMC), > 0. Required.
    batch_size : int, optional
        Minibatch size B <= N; full batch without it.
    schedule : {"constant", "polynomial", "cyclical"}
        The step-size schedule (default "constant"; cSGLD/cSGHMC always use "cyclical").
    num_cycles : int
        M for the cyclical schedule (4).
    decay_offset, decay_power : float
        b and γ of the polynomial schedule α_0 (1 + t / b)^(−γ).
    chunk_size : int, optional
        Steps per compiled call (default: up to 1000, bounded by memory).
    **kernel_options
        The kernel's own settings (e.g. ``temperature``, ``friction``, ``momentum_decay``,
        ``mass``, ``exploration``).

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = np.random.default_rng(0).normal(size=100)
    >>> post = bdl.fit(mean_model(y), backend="numpyro", method="sgld", step_size=1e-3,
    ...                batch_size=10, num_warmup=100, num_samples=200, num_chains=2, progress=False)
    >>> post.samples["mu"].shape
    (2, 200)
    """
    be, layout = setup.backend, setup.layout
    name = entry.name
    if step_size is None:
        raise ConfigError(
            f"method {name!r} needs a step_size (α_0 of the schedule; the learning rate for SGHMC), "
            "e.g. step_size=1e-4. There is no safe default: it depends on the data size and model."
        )
    plate = minibatch_plate(setup, batch_size)
    params = inspect.signature(entry.factory).parameters
    cyclical_stages = "exploration" in params
    if cyclical_stages:
        if schedule not in (None, "cyclical"):
            raise ConfigError(
                f"method {name!r} runs on the cyclical schedule with exploration stages; got "
                f"schedule={schedule!r}. Leave schedule out, or use 'sgld'/'sghmc' with "
                f"schedule={schedule!r}."
            )
        schedule = "cyclical"
        exploration = check_exploration(
            kernel_options.get("exploration", params["exploration"].default)
        )
    schedule = "constant" if schedule is None else schedule
    if schedule not in SCHEDULES:
        from ..errors import one_of

        raise one_of("schedule", schedule, list(SCHEDULES))

    if isinstance(num_cycles, bool) or not isinstance(num_cycles, int) or num_cycles < 1:
        raise ConfigError(f"num_cycles must be a positive int, got {num_cycles!r}.")
    if cyclical_stages:
        num_steps, keep = _cyclical_plan(
            num_warmup, num_samples * thinning, num_cycles, exploration
        )
    else:
        num_steps = num_warmup + num_samples * thinning
        keep = np.zeros(num_steps, bool)
        keep[num_warmup:] = True
    # Thinning: of the steps eligible to be kept, every thinning-th (the last of each block).
    eligible = np.flatnonzero(keep)[: num_samples * thinning]
    keep = np.zeros(num_steps, bool)
    keep[eligible[thinning - 1 :: thinning]] = True

    sizes = make_schedule(
        schedule, step_size, num_steps=num_steps, num_cycles=num_cycles,
        decay_offset=decay_offset, decay_power=decay_power,
    )  # fmt: skip
    kernel = _build_kernel(
        entry, params, kernel_options, num_steps=num_steps, num_cycles=num_cycles
    )
    with be.precision_scope(), be.activate():
        step_sizes = np.asarray(be.to_numpy(sizes(np.arange(num_steps))), dtype=float)
    positions0 = initial_positions(setup, init, num_chains, seed)
    potential = make_potential(setup.bound, be, layout, setup.params)
    dim = layout.dim
    if chunk_size is None:
        chunk_size = int(max(1, min(MAX_CHUNK, CHUNK_FLOATS // max(1, num_chains * dim))))
        if thinning <= chunk_size:  # whole thinning blocks per chunk (see _Driver._emit_every)
            chunk_size -= chunk_size % thinning
    chunk_size = min(chunk_size, num_steps)
    driver = _Driver(
        be, kernel, potential, plate, batch_size, step_sizes, keep, chunk_size, name, progress,
        schedule=sizes, thinning=thinning,
    )  # fmt: skip
    driver.use_site_gradient(setup)
    vectorised = getattr(be, "array_family", "") == "jax"
    chains = list(range(num_chains))
    groups = [chains] if vectorised else [[c] for c in chains]
    draws: list[np.ndarray] = []  # one (draw, dim) per chain
    stats: list[dict] = []
    for group in groups:
        failure = driver.run(group, positions0[group], seed, draws, stats)
        if failure is not None:
            raise _failure_error(setup, failure, draws, stats, name, num_samples)
    flat = np.stack(draws)
    sample_stats = {k: np.stack([s[k] for s in stats]) for k in stats[0]}
    return build_posterior(setup, flat, sample_stats, name)


def _cyclical_plan(num_warmup: int, needed: int, num_cycles: int, exploration: float):
    """Smallest T whose sampling-stage steps after warmup number at least ``needed``."""
    total = num_warmup + int(np.ceil(needed / (1.0 - exploration)))
    while True:
        total = max(total, num_cycles)
        keep = sampling_stage_mask(total, num_cycles, exploration)
        keep[:num_warmup] = False
        count = int(keep.sum())
        if count >= needed:
            return total, keep
        total += max(1, int(np.ceil((needed - count) / (1.0 - exploration))))


def _build_kernel(entry, params, options: dict, **supplied):
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = [k for k in options if k not in params and not var_kw]
    if unknown:
        settable = [n for n in accepted if n not in DRIVER_SUPPLIED]
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for method {entry.name!r}. Its kernel settings: "
            f"{settable}; driver settings: ['batch_size', 'chunk_size', 'decay_offset', "
            "'decay_power', 'num_cycles', 'schedule', 'step_size']."
        )
    given = {k: v for k, v in supplied.items() if k in params or var_kw}
    return entry.factory(**options, **given)


class _Driver:
    """Runs groups of chains (all at once on JAX, one at a time on torch) in compiled chunks."""

    def __init__(
        self, be, kernel, potential, plate, batch_size, step_sizes, keep, chunk, name, progress,
        schedule=None, thinning=1,
    ):  # fmt: skip
        self.be, self.kernel, self.potential = be, kernel, potential
        self.plate, self.batch_size = plate, batch_size
        self.step_sizes, self.keep, self.chunk = step_sizes, keep, chunk
        self.name, self.progress = name, progress
        self.vectorised = getattr(be, "array_family", "") == "jax"
        # On JAX the step size is computed in the loop from a step counter in the carry: a scalar
        # read from the scanned inputs measurably slows XLA's CPU step (about 2x here).
        self.schedule = schedule if self.vectorised else None
        self.normal_shapes: list = []
        self.runners: dict | None = None
        #: Kept draws are every ``thinning``-th step (see _emit_every).
        self.thinning = thinning
        self.traced_grad = None
        self._key_makers: dict = {}
        self.site_potential = None
        self.layout = None
        #: On JAX, the minibatch's index-only work (its gathers) done per chunk before the loop.
        self.index_work = None

    def use_site_gradient(self, setup: Setup) -> None:
        """On JAX, differentiate the potential per latent site (same value, a faster backward)."""
        if self.vectorised:
            self.layout = setup.layout
            self.site_potential = make_site_potential(setup.bound, setup.backend, setup.params)

    def _trace_grad(self, position) -> None:
        """On torch, trace the minibatch gradient once (a sound shortcut past the per-step
        model walk; see :func:`ppl_bdl.backends.pyro_kernels.trace_minibatch_grad`)."""
        if self.vectorised or self.traced_grad is not None or self.be.name != "pyro":
            return
        from ..backends.pyro_kernels import trace_minibatch_grad

        be = self.be
        with be.precision_scope():
            flat = be.asarray(position)
            idx = be.asarray(np.arange(self.batch_size)) if self.plate else None
            plate = self.plate[0] if self.plate else None
            self.traced_grad = trace_minibatch_grad(be, self.potential, plate, flat, idx)

    # -- the compiled step ------------------------------------------------------------------------
    def _grad_fn(self, idx):
        """The minibatch gradient of the flat position, for ``idx`` the step's indices (or,
        with :attr:`index_work`, the rows gathered for them before the loop)."""
        if self.traced_grad is not None:
            return lambda flat: self.traced_grad(flat, idx)
        if self.site_potential is None:
            batch = None if idx is None else {self.plate[0]: idx}
            potential = self.potential
            return self.be.grad(lambda flat: potential(flat, batch))
        # Differentiate per site and concatenate: the backward pass of slicing one flat vector
        # (pads and adds) costs more than the gradient of a small network.
        be, layout = self.be, self.layout
        if self.index_work is not None:
            rest = self.index_work.rest
            site_grads = lambda sites: rest(sites, idx)  # noqa: E731
        else:
            site_grads = lambda sites: self._site_grads(sites, idx)  # noqa: E731

        def flat_grad(flat):
            parts = site_grads(layout.unflatten(flat))
            return be.math.concatenate(
                [be.math.reshape(parts[s.name], (-1,)) for s in layout.slots]
            )

        return flat_grad

    def _site_grads(self, sites: dict, idx) -> dict:
        """The minibatch gradient of the potential per latent site, at batch indices ``idx``."""
        batch = None if idx is None else {self.plate[0]: idx}
        site_potential = self.site_potential
        return self.be.grad(lambda s: site_potential(s, batch))(sites)

    def _prepare_loops(self, state, key, idx, chains: int = 1) -> None:
        """Get ready to compile chunk runners (:meth:`_runner`, one per output spacing). Where
        the backend pays per draw inside a loop, the kernel's standard normals are recorded from
        one chain's step, to be drawn for the whole chunk before the loop (:mod:`ppl_bdl.prefetch`)."""
        be = self.be
        if self.vectorised and be.prefetch_normals:
            step_size = self.schedule(0) if self.schedule is not None else self.step_sizes[0]
            with be.activate():
                self.normal_shapes = prefetch.record_normal_shapes(
                    be, lambda s, k, i: self._chain_step(s, k, i, step_size), state, key, idx
                )
        self.index_work = self._split_index_work(state, idx, chains)
        self.runners = {}

    def _split_index_work(self, state, idx, chains: int):
        """On JAX, the minibatch gradient split into its index-only part (the gathers of the
        batch's rows), run for the whole chunk in the prologue, and the rest, run per step (see
        :mod:`ppl_bdl.backends._jax_index_work`). None where it does not apply or would not fit."""
        split = getattr(self.be, "split_index_work", None)
        if not (split and self.plate and self.site_potential):
            return None
        with self.be.activate():
            work = split(self._site_grads, self.layout.unflatten(state["position"]), idx)
        if work is None or work.data_bytes < GATHER_IN_BULK_BYTES:
            return None
        if work.size * self.chunk * chains > CHUNK_FLOATS:  # too many rows: gather per step
            return None
        return work

    def _prologue(self, carry, _keys, xs):
        """Before a chunk's loop: draw every chain's normals from its per-step keys (steps,
        chains, key); gather every step's minibatch rows from its indices (see index_work)."""
        xs = dict(xs)
        if self.normal_shapes:
            xs["normals"] = prefetch.draw_normals(self.be, xs["keys"], self.normal_shapes, 2)
        if self.index_work is not None:
            xs["idx"] = self.be.vmap(self.be.vmap(self.index_work.gather))(xs["idx"])
        return xs

    def _chain_step(self, state, key, idx, step_size, normals=None):
        be = self.be
        if normals is not None:
            with prefetch.replaying(*normals):
                return self._chain_step(state, key, idx, step_size)
        grad_fn = self._grad_fn(idx)
        if self.vectorised:  # per-step keys were split in bulk for the chunk (see _inputs)
            sub = key
        else:
            key, sub = be.random.split(key)
        new, info = self.kernel.step(sub, state, grad_fn, step_size)
        info = dict(info)
        info["finite"] = be.math.isfinite(be.math.sum(new["position"]))
        return new, key, info

    def _loop_step(self, carry, _key, x):
        be = self.be
        with be.activate():
            if self.schedule is not None:
                step_size = self.schedule(carry["t"])
            else:
                step_size = x["step_size"]
            single = lambda s, k, i, n: self._chain_step(s, k, i, step_size, n)  # noqa: E731
            keys = x["keys"] if self.vectorised else carry["keys"]
            args = (carry["state"], keys, x.get("idx"), x.get("normals"))
            if not self.vectorised:
                state, keys, info = single(*args)
            elif _leading(keys) == 1:
                # One chain: drop the chain axis instead of vmapping over it (a batch of one
                # turns every matmul into a batched one).
                first = be.tree_map(lambda a: a[0], args)
                out = single(*first)
                state, keys, info = be.tree_map(lambda a: be.math.expand_dims(a, 0), out)
            else:
                state, keys, info = be.vmap(single)(*args)
        out = dict(info)
        out["position"] = state["position"]
        new = {"state": state}
        if not self.vectorised:
            new["keys"] = keys
        if "t" in carry:
            new["t"] = carry["t"] + 1
        return new, out

    def _check(self, out):
        finite = out["finite"]
        return self.be.math.min(finite * 1) > 0 if self.vectorised else finite

    # -- running ----------------------------------------------------------------------------------
    def run(self, group: list[int], positions0: np.ndarray, seed: int, draws: list, stats: list):
        """Run ``group`` of chains; append their kept draws and stats. Return a failure or None."""
        be, kernel = self.be, self.kernel
        self._trace_grad(positions0[0])
        with be.precision_scope(), be.activate():
            if self.vectorised:
                keys = be.math.stack([be.random.key(chain_seed(seed, c)) for c in group])
                state = be.vmap(kernel.init)(be.asarray(positions0))
                if self.runners is None:
                    idx0 = be.asarray(np.zeros(self.batch_size), "int") if self.plate else None
                    self._prepare_loops(
                        kernel.init(be.asarray(positions0[0])), keys[0], idx0, len(group)
                    )
            else:
                keys = be.random.key(chain_seed(seed, group[0]))
                state = kernel.init(be.asarray(positions0[0]))
                if self.runners is None:
                    self._prepare_loops(state, keys, None)
            loop_key = be.random.key(0)
            carry = {"state": state} if self.vectorised else {"state": state, "keys": keys}
            if self.schedule is not None:
                carry["t"] = be.asarray(np.asarray(0), dtype="int")
        self._chain_keys = keys
        total = len(self.keep)
        # JAX: one compiled shape, the last chunk padded; torch: no wasted steps.
        drawn = -(-total // self.chunk) * self.chunk if self.vectorised else total
        batches = [
            EpochBatches(self.plate[1], self.batch_size, [seed, c, 7], num_batches=drawn)
            if self.plate
            else None
            for c in group
        ]
        kept_pos, kept_info = [], []
        failure = None
        length = (lambda start: self.chunk) if self.vectorised else (
            lambda start: min(self.chunk, total - start))  # fmt: skip

        def dispatch(start: int, previous: _Chunk | None) -> _Chunk:
            n, every = length(start), self._emit_every(start, length(start))
            with be.precision_scope():
                xs = self._inputs(start, n, batches)
            chunk_carry = carry if previous is None else previous.result.carry
            # the loop's own keys go unused (the per-step keys are in xs)
            return _Chunk(start, n, every, self._runner(every)(chunk_carry, loop_key, xs, n))

        # Each chunk is queued before the previous one is read (see ppl_bdl.inference.chunks).
        queued = run_ahead(dispatch, range(0, total, self.chunk), chunks_ahead(be))
        start = 0
        while start < total:
            try:
                chunk = next(queued)
                stopped_at = chunk.result.stopped_at
            except KeyboardInterrupt:  # keep the draws of the chunks that finished
                failure = (start, group, float(self.step_sizes[start]), "interrupted")
                break
            n, every, result = chunk.n, chunk.every, chunk.result
            stop = min(n, total - start)
            if stopped_at is not None:
                stop = min(stop, stopped_at)
            outs = {k: np.asarray(be.to_numpy(v)) for k, v in result.outputs.items()}
            # Output j is step start + (j + 1) * every - 1; keep those before the stop.
            steps = start + np.arange(every - 1, n, every)
            emitted = steps < start + stop
            mask = self.keep[steps[emitted]]
            count = int(emitted.sum())
            kept_pos.append(outs["position"][:count][mask])
            kept_info.append(
                {k: v[:count][mask] for k, v in outs.items() if k not in ("position", "finite")}
            )
            if stopped_at is not None and start + stopped_at < total:
                step = start + stopped_at
                failure = (step, self._failed_chains(group, result.carry, outs, stopped_at),
                           float(self.step_sizes[step]), "nonfinite")  # fmt: skip
                break
            start += self.chunk
            if self.progress:
                print(
                    f"{self.name} chains {group}: {min(start, total)}/{total} steps",
                    file=sys.stderr,
                )
        if not kept_pos:  # interrupted in the first chunk: nothing kept for this group
            return failure
        positions = np.concatenate(kept_pos)
        info = {k: np.concatenate([d[k] for d in kept_info]) for k in kept_info[0]}
        if not self.vectorised:  # add the chain axis: (draw, ...) -> (draw, 1, ...)
            positions = positions[:, None]
            info = {k: v[:, None] for k, v in info.items()}
        for i in range(len(group)):
            draws.append(positions[:, i])
            stats.append({k: v[:, i] for k, v in info.items()})
        return failure

    def _emit_every(self, start: int, n: int) -> int:
        """Steps per emitted output in the chunk at ``start``: on JAX only the kept steps'
        positions and stats need leaving the loop (the others are then never computed), so a
        warmup chunk emits once and a thinned one every ``thinning`` steps; else every step."""
        if not self.vectorised:
            return 1
        kept = np.flatnonzero(self.keep[start : start + n]) + 1
        every = n if kept.size == 0 else int(np.gcd.reduce(np.append(kept, n)))
        return every if every in (n, self.thinning) else 1

    def _runner(self, every: int):
        if every not in self.runners:
            prologue = self._prologue if self.normal_shapes or self.index_work else None
            # stage_inputs: each step's indices and normals come from a buffer of their own
            # (about 3% faster on XLA's CPU backend than slicing the chunk inside fused ops).
            self.runners[every] = self.be.compile_loop(
                self._loop_step, self._check, prologue=prologue, freeze=False, emit_every=every,
                stage_inputs=True,
            )  # fmt: skip
        return self.runners[every]

    def _chunk_keys(self, n: int):
        """A compiled ``chain keys -> (next chain keys, per-step keys (n, chains, key))``: one
        call per chunk instead of a few small eager ones per chain."""
        if n not in self._key_makers:
            be = self.be

            def per_chain(key):
                key, chunk_key = be.random.split(key)
                return key, be.random.keys(chunk_key, n)

            def chunk_keys(chain_keys):
                nxt, steps = be.vmap(per_chain)(chain_keys)
                return nxt, be.math.transpose(steps, (1, 0, 2))

            self._key_makers[n] = be.jit(chunk_keys)
        return self._key_makers[n]

    def _failed_chains(self, group: list[int], carry, outs: dict, stopped_at: int) -> list[int]:
        """The chains of ``group`` that reached NaN/inf (the first one when it cannot be told)."""
        if self.vectorised:  # the carry is not frozen: a failed chain's position stays non-finite
            position = np.asarray(self.be.to_numpy(carry["state"]["position"]))
            finite = np.isfinite(position.reshape(len(group), -1)).all(axis=1)
        else:
            finite = np.asarray(outs["finite"][stopped_at]).reshape(-1).astype(bool)
        return [group[i] for i in np.flatnonzero(~finite)] or group[:1]

    def _inputs(self, start: int, n: int, batches) -> dict:
        be = self.be
        sizes = self.step_sizes[start : start + n]
        if len(sizes) < n:  # pad the last chunk: one compiled shape; padded steps are discarded
            sizes = np.concatenate([sizes, np.full(n - len(sizes), sizes[-1])])
        xs = {} if self.schedule is not None else {"step_size": be.asarray(sizes)}
        if self.vectorised:
            # Per-step keys of every chain for the whole chunk, split in bulk outside the loop
            # (cheaper than splitting inside it); each chain's stream depends only on its seed.
            self._chain_keys, xs["keys"] = self._chunk_keys(n)(self._chain_keys)
        if batches[0] is not None:
            idx = np.stack([b.next_block(n) for b in batches], axis=1)  # (steps, chains, B)
            xs["idx"] = be.asarray(idx if self.vectorised else idx[:, 0])
        return xs


class _Chunk(NamedTuple):
    """A dispatched chunk: its first step, length, output spacing and (future) result."""

    start: int
    n: int
    every: int
    result: Any


def _leading(array) -> int:
    return int(array.shape[0])


def _failure_error(setup, failure, draws, stats, name: str, num_samples: int) -> InferenceError:
    step, chains, size, reason = failure
    partial = None
    if draws and min(len(d) for d in draws) > 0:
        n = min(len(d) for d in draws)
        flat = np.stack([d[:n] for d in draws])
        sample_stats = {k: np.stack([s[k][:n] for s in stats]) for k in stats[0]}
        partial = build_posterior(setup, flat, sample_stats, name)
    kept = (
        "no draws were kept yet"
        if partial is None
        else (
            f"the {partial.samples[setup.layout.names[0]].shape[1]} draws kept per chain before it are "
            "in error.partial"
        )
    )
    if reason == "interrupted":
        return InferenceError(
            f"SG-MCMC kernel {name!r} was interrupted at step {step} of chain {chains[0]}. "
            f"{kept[0].upper() + kept[1:]} (of {num_samples} requested).",
            partial=partial,
        )
    return InferenceError(
        f"SG-MCMC kernel {name!r}: chain {chains[0]} reached NaN or inf at step {step} (step size "
        f"{size:.3g}). The step size is too large for this model and data: try a smaller step_size "
        f"(e.g. {size / 10:.1g}), a decaying schedule, or a smaller batch noise (larger batch_size). "
        f"{kept[0].upper() + kept[1:]} (of {num_samples} requested).",
        partial=partial,
    )
