"""Posteriors of groups of chains joined along the chain axis, and a posterior made ready to
cross to another process.

An executor (:mod:`ppl_bdl.run.executor`) runs a fit's chains in groups, each group a
``fit(..., chain_ids=[...])`` whose draws are those the chains have in the whole run;
:func:`merge_chains` joins the groups' posteriors into the one the whole run gives, with the
post-fit checks (:func:`ppl_bdl.posterior.diagnostics.check_fit`) computed again on the joined chains.
:func:`detach` is what a worker sends back: the draws without the model and its compiled
replays (the pointwise log-likelihood computed there, where it is cheap to compute).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.posterior.chains import merge_chains
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     bdl.sample("y", dist.Normal(mu, 1.0), obs=y)
>>> kw = dict(backend="numpyro", method="nuts", num_warmup=50, num_samples=50, num_chains=3,
...           progress=False)
>>> whole = bdl.fit(m(np.array(0.5)), **kw)
>>> parts = [bdl.fit(m(np.array(0.5)), chain_ids=ids, **kw) for ids in ([0, 1], [2])]
>>> merged = merge_chains(parts)
>>> merged.samples["mu"].shape, bool(np.array_equal(merged.samples["mu"], whole.samples["mu"]))
((3, 50), True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ppl_bdl.posterior.diagnostics import check_fit
from ppl_bdl.posterior.posterior import Posterior

#: What every part must share to be chains of one fit.
_SAME = ("method", "backend", "precision", "model_name", "latent_names")
#: Settings that hold one value per chain (an ensemble's member numbers): joined, not compared.
PER_CHAIN_SETTINGS = ("members",)


def merge_chains(parts: Sequence[Posterior], model: Any = None) -> Posterior:
    """One :class:`~ppl_bdl.posterior.posterior.Posterior` of the chains of ``parts``, in their order.

    Samples, sample_stats and the pointwise log-likelihood are joined along the chain axis (a
    log-likelihood not yet computed stays so until it is read), and so are an ensemble's
    losses (member, step) and member numbers (``settings["members"]``); the other settings are
    the parts' (a setting whose value differs between parts becomes the list of their values); the
    diagnostics are computed again on the joined chains (R-hat compares every chain). ``model``
    is the bound model to attach (default: the first part's).

    Raises
    ------
    ValueError
        When the parts are not chains of one fit (another method, backend, sites or number of
        draws, losses of another length), or are VI fits (fitted guides: merge the chains of
        MCMC fits and the members of ensembles).
    """
    parts = list(parts)
    if not parts:
        raise ValueError("merge_chains needs at least one Posterior, got none.")
    first = parts[0]
    for i, part in enumerate(parts):
        if part.guide is not None:
            raise ValueError(
                f"part {i} is a {part.method!r} fit with a guide: merge_chains joins the chains of "
                "MCMC fits and ensembles' members (draws along a chain axis), not fitted guides."
            )
        if (part.losses is None) != (first.losses is None) or (
            part.losses is not None and np.shape(part.losses)[1:] != np.shape(first.losses)[1:]
        ):
            raise ValueError(
                f"part {i} has losses of shape {np.shape(part.losses)}, part 0 "
                f"{np.shape(first.losses)}: only members of one ensemble (same num_steps) can be "
                "merged."
            )
        for name in _SAME:
            if getattr(part, name) != getattr(first, name):
                raise ValueError(
                    f"part {i} has {name}={getattr(part, name)!r} but part 0 has "
                    f"{getattr(first, name)!r}: only chains of one fit can be merged."
                )
        if list(part.samples) != list(first.samples) or part.num_draws != first.num_draws:
            raise ValueError(
                f"part {i} has sites {list(part.samples)} with {part.num_draws} draws per chain; "
                f"part 0 has {list(first.samples)} with {first.num_draws}: only chains of one fit "
                "(same sites, same num_samples) can be merged."
            )
        if set(part.sample_stats) != set(first.sample_stats):
            raise ValueError(
                f"part {i} has sample_stats {sorted(part.sample_stats)}, part 0 "
                f"{sorted(first.sample_stats)}: only chains of one fit can be merged."
            )
    merged = Posterior(
        samples=_join([p.samples for p in parts]),
        sample_stats=_join([p.sample_stats for p in parts]),
        log_likelihood=(
            JoinedLogLikelihood([p.log_likelihood for p in parts]) if first.log_likelihood else {}
        ),
        observed_data=first.observed_data,
        dims=first.dims,
        method=first.method,
        backend=first.backend,
        precision=first.precision,
        model=model if model is not None else first.model,
        params=first.params,
        latent_names=list(first.latent_names),
        model_name=first.model_name,
        settings=_settings([p.settings for p in parts]),
        losses=None if first.losses is None else np.concatenate([p.losses for p in parts]),
    )
    merged.diagnostics = check_fit(merged)
    return merged


def detach(post: Posterior) -> Posterior:
    """``post`` ready to be pickled and sent to another process: without its model (the
    receiver has it) and with its pointwise log-likelihood computed (the replays that compute
    it are compiled programs of this process)."""
    return dataclasses.replace(
        post, model=None, log_likelihood={k: np.asarray(v) for k, v in post.log_likelihood.items()}
    )


def _join(dicts: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([np.asarray(d[k]) for d in dicts]) for k in dicts[0]}


def _settings(all_settings: list[dict]) -> dict:
    """The parts' settings; one that differs between parts is the list of their values."""
    merged = {}
    for key in dict.fromkeys(k for s in all_settings for k in s):
        values = [s.get(key) for s in all_settings]
        if key in PER_CHAIN_SETTINGS and all(isinstance(v, list) for v in values):
            merged[key] = [c for v in values for c in v]
        else:
            merged[key] = values[0] if all(v == values[0] for v in values) else values
    return merged


class JoinedLogLikelihood(Mapping):
    """The pointwise log-likelihood of chains held by several parts, joined along the chain
    axis the first time a site is read (a part whose own log-likelihood is not computed yet
    computes it then)."""

    def __init__(self, parts: list[Mapping[str, np.ndarray]]):
        self._parts = parts
        self._names = list(parts[0])
        self._values: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._values:
            self._values[name] = np.concatenate([np.asarray(p[name]) for p in self._parts])
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"<pointwise log-likelihood of {self._names} over {len(self._parts)} parts>"
