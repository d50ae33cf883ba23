"""A bound model prepared for inference on one backend: the record of its one validating run
(:func:`ppl_bdl.trace.model_trace.record_model`) and the flat layout of its continuous latents, which every
method, check, start and guide of a fit reads.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.setup import prepare
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     bdl.sample("y", dist.Normal(mu, 1.0), obs=y)
>>> setup = prepare(m(np.array(0.5)), "numpyro", "float32", seed=0)
>>> setup.layout.names, list(setup.sites)
(['mu'], ['mu', 'y'])
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.model import BoundModel, unbound_message
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.trace.interpreter import SiteRecord
from ppl_bdl.trace.layout import LatentLayout
from ppl_bdl.trace.model_trace import ModelTrace, record_model, trace_model
from ppl_bdl.trace.programs import (
    array_value_key,
    keyed,
    same,
    shapes_key,
    structure_key,
)


@dataclass
class Setup:
    """A bound model prepared on one backend (with its device and precision): the record of its
    one validating run, the flat layout of its continuous latents, the values of its params,
    the fit's settings, and its prior draws once made (by seed: see :func:`prior_draws`)."""

    trace: ModelTrace
    layout: LatentLayout
    params: dict
    settings: dict = field(default_factory=dict)
    prior: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def bound(self) -> BoundModel:
        return self.trace.bound

    @property
    def backend(self) -> Any:
        return self.trace.backend

    @property
    def sites(self) -> dict[str, SiteRecord]:
        return self.trace.sites

    def program_key(self) -> Hashable | None:
        """What a program that runs this model's density depends on
        (:mod:`ppl_bdl.trace.programs`): the model (by identity), the backend, the
        values bound that are not data arrays, the data arrays' shapes and dtypes, the params'
        values (baked into the program) and the latent layout. None where a bound value has no
        exact key (a module object): such a fit compiles its own programs."""
        backend = self.backend
        data, template = self.bound.data_arrays(backend)

        def build() -> tuple:
            params = tuple(
                (name, array_value_key(backend.to_numpy(value)))
                for name, value in sorted(self.params.items())
            )
            return (
                same(self.bound.model),
                same(backend),
                structure_key(template),
                shapes_key(data),
                params,
                tuple(self.layout.slots),
                tuple(self.layout.discrete),
            )

        return keyed(build)


def prepare(
    bound,
    backend: str | None,
    precision: str,
    seed: int,
    device=None,
    allow_discrete: bool = True,
    shard: str | None = None,
) -> Setup:
    """Validate and trace ``bound`` on ``backend`` (on ``device``: one, or several with
    ``shard`` saying what is split over them); lay out its latents (its discrete latents are
    summed out of the potential: :mod:`ppl_bdl.trace.enumeration`)."""
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    backend = get_backend(backend, precision=precision, device=device, shard=shard)
    record = record_model(bound, backend, seed=seed)
    layout = LatentLayout.from_sites(record.sites, backend, allow_discrete=allow_discrete)
    if layout.dim == 0:
        raise ModelError(
            f"model {bound.name!r} has no continuous latent sites to infer (sites: "
            f"{list(record.sites)}). Add a bdl.sample site without obs."
        )
    return Setup(record, layout, record.params)


def minibatch_plate(
    setup: Setup, batch_size: int | None, local: frozenset = frozenset()
) -> tuple[str, int] | None:
    """The (plate name, size N) to subsample, or None for full batch. Validates ``batch_size``.
    ``local``: latent sites in the plate that a step gives for the minibatch's points only (an
    amortized guide's); any other latent in the plate is refused."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}.")
    if setup.layout.discrete:
        raise ConfigError(
            f"batch_size={batch_size}: the model has discrete latent sites "
            f"{setup.layout.discrete}, summed out over the whole data set, so it takes no "
            "minibatches. Fit without batch_size (NUTS, HMC, VI and the SG-MCMC kernels all "
            "sum them out on full batches)."
        )
    plates = setup.trace.observed_plates
    if len(plates) != 1:
        raise ConfigError(
            f"batch_size needs exactly one plate around the observed sites to subsample; found "
            f"{sorted(plates) or 'none'}. Wrap the likelihood in `with bdl.plate('data', N) as idx:` "
            "and index the data with idx."
        )
    ((name, size),) = plates.items()
    if batch_size > size:
        raise ConfigError(
            f"batch_size={batch_size} is larger than the data (plate {name!r} has N={size}). Use "
            f"batch_size <= {size}, or leave it out for full-batch steps."
        )
    _check_indexed(setup, name, size, batch_size, frozenset(local))
    return name, size


def _check_indexed(
    setup: Setup, plate: str, size: int, batch_size: int, local: frozenset = frozenset()
) -> None:
    """Run the model once on a minibatch: an observed site of the plate whose data is not indexed
    with the plate's indices would be scaled by N/B over all of its N values. (The one check the
    record cannot answer: over the whole plate its indices read the same values as no index.)"""
    if batch_size == size:
        return
    values = dict(setup.trace.latent_values)
    for name in local & set(values):  # the first batch_size points of a local site
        site = setup.sites[name]
        frame = next((f for f in site.plates if f.name == plate), None)
        if frame is not None:
            axis = len(site.shape.batch) + frame.dim
            values[name] = values[name][(slice(None),) * axis + (slice(0, batch_size),)]
    try:
        trace_model(
            setup.bound,
            setup.backend,
            values=values,
            missing="error",
            batch={plate: np.arange(batch_size)},
            check_bounds=False,
            local=local,
        )
    except ModelError as err:
        if "obs has shape" not in str(err):
            raise
        raise ConfigError(
            f"with batch_size={batch_size} the plate {plate!r} yields {batch_size} of its {size} "
            f"indices per step, but an observed site in it does not use them: {err} Index the "
            "data with the plate's indices (`with bdl.plate(...) as idx:` then `obs=y[idx]`, "
            "`X[idx]`)."
        ) from err
