"""Where an amortized guide's pieces are in a model: its local sites and their data plate
(checked), the layout of the other latents, the model argument the encoder reads.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.vi.guides.amortized_sites import input_argument
>>> @bdl.model
... def m(X, scale=1.0):
...     with bdl.plate("data", X.shape[0]) as idx:
...         z = bdl.sample("z", dist.Normal(0.0, scale))
...         bdl.sample("x", dist.Normal(z, 1.0), obs=X[idx])
>>> input_argument(m(np.zeros(4)), bdl.backends.get("numpyro"), None, 4)
('X', 0)
"""

from __future__ import annotations

import inspect

import numpy as np

from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.trace.layout import LatentLayout, LatentSlot


def local_plate(sites: list[str], trace, layout: LatentLayout) -> tuple[str, int]:
    """The data plate the local sites share, checked: (its name, its size N)."""
    if layout.discrete:
        raise ModelError(
            f"an amortized guide needs continuous latent sites; the model has discrete latent "
            f"sites {layout.discrete}, summed out over the whole data set. Fit it with another guide."
        )
    observed = trace.observed_plates
    if len(observed) != 1:
        raise ModelError(
            f"an amortized guide needs one data plate around the observed sites (its points are "
            f"what the encoder reads); found {sorted(observed) or 'none'}."
        )
    ((plate, size),) = observed.items()
    latent = {n: s for n, s in trace.sites.items() if s.kind == "latent"}
    for name in sites:
        if name not in latent:
            raise ModelError(
                f"Amortized(sites=...): {name!r} is not a latent site of model "
                f"{trace.bound.name!r} (latent sites: {sorted(latent)})."
            )
        site = latent[name]
        names = [f.name for f in site.plates]
        if names != [plate] or len(site.shape.batch) != 1:
            raise ModelError(
                f"Amortized(sites=...): site {name!r} sits in the plates {names or 'none'}; a local "
                f"site of an amortized guide sits in the data plate {plate!r} only, one value per "
                f"point (value shape (N, ...) with N = {size}), so the encoder gives q(z_i|x_i)."
            )
    others = [
        n for n, s in latent.items() if n not in sites and any(f.name == plate for f in s.plates)
    ]
    if others:
        raise ModelError(
            f"latent site(s) {others} sit in the data plate {plate!r} but not in the amortized "
            f"guide's sites {sites}: a local latent needs q(z_i|x_i) from the encoder. Add them "
            "to sites= (and widen the encoder's output), or move them out of the plate."
        )
    return plate, size


def global_layout(layout: LatentLayout, local: set) -> tuple[LatentLayout, np.ndarray]:
    """The layout of the non-local latents, and their coordinates in the full flat vector."""
    slots, index, offset = [], [], 0
    for s in layout.slots:
        if s.name in local:
            continue
        slots.append(LatentSlot(s.name, s.shape, s.unconstrained_shape, offset, s.size))
        index.append(np.arange(s.offset, s.offset + s.size))
        offset += s.size
    index = np.concatenate(index) if index else np.zeros(0, np.int64)
    return LatentLayout(slots, layout.sites, []), index


def input_argument(bound, backend, name: str | None, size: int) -> tuple[str, int]:
    """(the name of the model argument the encoder reads, its position among the bound data's
    arrays): ``name``, or the one array argument whose first axis has ``size`` points."""
    try:
        bound_args = inspect.signature(bound.model.fn).bind(*bound.args, **bound.kwargs)
    except (TypeError, ValueError) as err:
        raise ModelError(f"cannot read the arguments of model {bound.name!r}: {err}") from err
    host = dict(bound_args.arguments)
    candidates = [k for k, v in host.items() if np.ndim(v) >= 1 and np.shape(v)[0] == size]
    if name is None:
        if len(candidates) != 1:
            raise ConfigError(
                f"Amortized: which argument of {bound.name!r} does the encoder read? The array "
                f"arguments with {size} rows (the data plate's size) are {candidates or 'none'}; "
                "pass inputs='<argument name>'."
            )
        name = candidates[0]
    elif name not in host:
        raise ConfigError(
            f"Amortized(inputs={name!r}): model {bound.name!r} has no argument {name!r} "
            f"(arguments: {list(host)})."
        )
    elif name not in candidates:
        raise ConfigError(
            f"Amortized(inputs={name!r}): the argument has shape {np.shape(host[name])}; the "
            f"encoder reads one row per point of the data plate ({size} points)."
        )
    args, kwargs = bound.data_for(backend)
    converted = inspect.signature(bound.model.fn).bind(*args, **kwargs).arguments[name]
    arrays, _ = bound.data_arrays(backend)
    position = next((i for i, a in enumerate(arrays) if a is converted), None)
    if position is None:  # pragma: no cover - an argument of `size` rows is an array
        raise ConfigError(f"Amortized(inputs={name!r}): the argument is not an array.")
    return name, position
