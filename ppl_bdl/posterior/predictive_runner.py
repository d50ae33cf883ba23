"""Running a model forward at many draws: compiled once per model and shapes, in bounded memory.

:func:`run_predictive` replays a bound model once per row of ``values`` (posterior draws of its
latent sites; none for the prior), drawing every other site, and returns the draws and the
moments of the predicted sites. It

- compiles once per model, backend and shapes (the data's arrays are arguments of the compiled
  function, not constants in it: predicting at new inputs of the same shapes reuses it);
- runs the draws in chunks, and the points of the data plate in chunks too (the model run on
  a subset of its plate's indices, as minibatching does), so 10,000 points at 1,000 draws of a
  deep network never hold all their activations at once.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.posterior.predictive_runner import run_predictive
>>> @bdl.model
... def m(n=5):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", n):
...         bdl.sample("y", dist.Normal(mu, 1.0))
>>> backend = bdl.backends.get("numpyro")
>>> draws, moments = run_predictive(m(), backend, {"mu": np.zeros(3)}, 3, seed=0, params={})
>>> draws["y"].shape   # moments have their distribution's own shape: here (3,) for the mean
(3, 5)
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.dsl.nn.dropout import DROPOUT_SEED, ActiveDropout
from ppl_bdl.trace.interpreter import Evaluator

#: Families whose predictive summaries are class probabilities.
CLASSIFIERS = ("Categorical", "Bernoulli")
#: Discrete families whose mean and variance are summarised like a regression's.
COUNTS = ("Poisson", "Binomial")
#: Draws times points per compiled call (bounds the activations held at once).
CHUNK_ELEMENTS = 1 << 17
MAX_DRAWS_PER_CALL = 64


def run_predictive(
    bound,
    backend,
    values: dict,
    num_samples: int,
    seed: int,
    params: dict,
    sites: dict | None = None,
    dropout_seeds: np.ndarray | None = None,
) -> tuple[dict, dict]:
    """Draw every site not in ``values`` once per row of ``values``; return draws and moments
    (NumPy, leading axis: draws). ``sites`` is a validating trace of ``bound`` (for chunking the
    data plate; without it the points are not chunked). ``dropout_seeds``, one per row (MC
    dropout's draws), runs the model's Dropout layers with each row's masks."""
    arrays, template = bound.data_arrays(backend)
    seeded = dropout_seeds is not None
    if seeded:
        values = {**values, DROPOUT_SEED: np.asarray(dropout_seeds)}
    plate, axes = _point_chunking(sites or {})
    size = sites_plate_size(sites, plate) if plate else 0
    per_call = max(1, min(num_samples, MAX_DRAWS_PER_CALL))
    points = max(1, min(size, CHUNK_ELEMENTS // per_call)) if plate else 0
    run = _compiled(bound, backend, template, params, plate, seeded)
    draws_parts, moment_parts = [], []
    with backend.scope(), backend.activate():
        for start in range(0, num_samples, per_call):
            rows = min(per_call, num_samples - start)
            chunk = {
                k: backend.asarray(_pad(np.asarray(v)[start : start + rows], per_call))
                for k, v in values.items()
            }
            keys = backend.random.keys(backend.random.key(seed + start), per_call)
            d_parts, m_parts = [], []
            for p_start in range(0, size, points) if plate else [None]:
                idx, real = None, None
                if plate:
                    real = min(points, size - p_start)
                    idx = backend.asarray(_pad(np.arange(p_start, p_start + real), points), "int")
                d, m = run(chunk, keys, arrays, idx)
                d_parts.append(
                    {k: _trim(backend.to_numpy(v)[:rows], axes.get(k), real) for k, v in d.items()}
                )
                m_parts.append(
                    {
                        k: {
                            n: _trim(
                                _full(backend.to_numpy(a)[:rows], sites, k, n, axes, points),
                                axes.get(k),
                                real,
                            )
                            for n, a in v.items()
                        }
                        for k, v in m.items()
                    }
                )
            draws_parts.append(_join(d_parts, axes))
            moment_parts.append(
                {
                    k: _join([p[k] for p in m_parts], {n: axes.get(k) for n in v})
                    for k, v in m_parts[0].items()
                }
            )
    draws = {k: np.concatenate([p[k] for p in draws_parts]) for k in draws_parts[0]}
    moments = {
        k: {n: np.concatenate([p[k][n] for p in moment_parts]) for n in v}
        for k, v in moment_parts[0].items()
    }
    return draws, moments


def sites_plate_size(sites, plate: str) -> int:
    for site in sites.values():
        for frame in site.plates:
            if frame.name == plate:
                return frame.size
    return 0


def _compiled(bound, backend, template, params: dict, plate: str | None, seeded: bool = False):
    """``run(values, keys, data, idx)`` vmapped over draws and compiled, cached on the model;
    ``seeded``: ``values[DROPOUT_SEED]`` holds each draw's mask seed (its Dropout layers on)."""
    cache = bound.model.compiled
    key = (
        "predictive",
        backend.name,
        backend.precision,
        backend.device,
        repr(template),
        plate,
        tuple(sorted(params)),
        seeded,
    )
    if key not in cache:

        def one(vals, rng_key, data, idx, params):
            handlers = ()
            if seeded:
                handlers = (ActiveDropout.from_seed(backend, vals[DROPOUT_SEED]),)
                vals = {k: v for k, v in vals.items() if k != DROPOUT_SEED}
            args, kwargs = fill_data(template, data)
            batch = None if idx is None else {plate: idx}
            ev = Evaluator(
                backend,
                values=vals,
                params=params,
                key=rng_key,
                predictive=True,
                missing="prior",
                record=True,
                batch=batch,
            )
            bound.run_with(ev, (args, kwargs), handlers)
            return _draws_and_moments(ev.sites, vals)

        mapped = backend.vmap(one, in_axes=(0, 0, None, None, None))
        cache[key] = backend.jit(mapped)
    compiled = cache[key]
    params_arrays = {k: backend.asarray(v) for k, v in params.items()}
    return lambda vals, keys, data, idx: compiled(vals, keys, data, idx, params_arrays)


def _draws_and_moments(sites: dict, vals: dict) -> tuple[dict, dict]:
    draws, moments = {}, {}
    for name, site in sites.items():
        if name in vals or site.kind in ("param", "factor"):
            continue
        draws[name] = site.value
        if site.kind in ("latent", "observed") and site.spec is not None:
            if site.spec.family in CLASSIFIERS:  # a masked or reshaped one too
                moments[name] = {"probs": _family_native(site.native).probs}
            elif not site.spec.is_discrete or site.spec.family in COUNTS:
                moments[name] = {"mean": site.native.mean, "variance": site.native.variance}
    return draws, moments


def _family_native(native):
    """The backend's distribution of the family under its masks and reshapes (their
    ``base_dist``), which holds the family's parameters (``probs``)."""
    while not hasattr(native, "probs") and hasattr(native, "base_dist"):
        native = native.base_dist
    return native


def _point_chunking(sites: dict) -> tuple[str | None, dict]:
    """The plate whose points can be run in chunks, and the axis it has in each site's value
    (sites outside it are global: the same in every chunk). None when there is no single data
    plate, or a site in it has an axis that cannot be told."""
    plates = {f.name for s in sites.values() if s.kind == "observed" for f in s.plates}
    if len(plates) != 1:
        return None, {}
    (plate,) = plates
    axes = {}
    for name, site in sites.items():
        frame = next((f for f in site.plates if f.name == plate), None)
        if frame is None or site.kind in ("param", "factor"):
            continue
        if site.shape is not None:
            axes[name] = len(site.shape.batch) + frame.dim
        else:
            ndim = len(getattr(site.value, "shape", ()))
            if ndim != len(site.plates):
                return None, {}
            axes[name] = ndim + frame.dim
    return plate, axes


def _full(moment: np.ndarray, sites, name: str, kind: str, axes: dict, points: int):
    """A chunk's moment broadcast to its site's chunk shape, so its plate axis is where the
    site's is (a moment may have fewer dims: ``Normal(f(x), sigma)``'s variance is a scalar)."""
    axis = axes.get(name)
    if axis is None or sites[name].shape is None:
        return moment
    shape = sites[name].shape
    target = list(shape.batch + shape.extra)
    target[axis] = points
    # Categorical probabilities have a class axis after the site's shape; Bernoulli's do not.
    classes = kind == "probs" and sites[name].spec.family == "Categorical"
    trailing = moment.shape[-1:] if classes else ()
    core = moment.shape[1 : moment.ndim - len(trailing)]
    padded = moment.reshape(moment.shape[:1] + (1,) * (len(target) - len(core)) + core + trailing)
    return np.broadcast_to(padded, moment.shape[:1] + tuple(target) + trailing)


def _trim(array: np.ndarray, axis: int | None, real: int | None) -> np.ndarray:
    """Drop a chunk's padded points (the plate ``axis`` of each draw)."""
    if axis is None or real is None:
        return array
    return np.take(array, np.arange(real), axis=axis + 1)


def _join(parts: list[dict], axes: dict) -> dict:
    """Point chunks put back together along each site's plate axis (globals: the first)."""
    if len(parts) == 1:
        return parts[0]
    return {
        k: parts[0][k]
        if axes.get(k) is None
        else np.concatenate([p[k] for p in parts], axes[k] + 1)
        for k in parts[0]
    }


def _pad(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` with its last row repeated up to ``size`` rows (one compiled shape)."""
    if len(array) == size:
        return array
    return np.concatenate([array, np.repeat(array[-1:], size - len(array), axis=0)])
