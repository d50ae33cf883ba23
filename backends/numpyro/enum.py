"""NumPyro's enumeration of discrete latent sites and its scan (``numpyro.contrib.funsor``,
``numpyro.contrib.control_flow``), for models lowered by the core (:mod:`ppl_bdl.trace.enumeration`).

Enumeration needs ``funsor`` (in the ``numpyro`` extra); without it the error says how to
install it.
"""

from __future__ import annotations

from numpyro import handlers
from numpyro.contrib.control_flow import scan as _scan

from ppl_bdl.errors import BackendError


def _funsor():
    try:
        from numpyro.contrib import funsor as numpyro_funsor
    except ImportError:
        raise BackendError(
            "summing out discrete latent sites on the numpyro backend needs funsor: pip install "
            "funsor (or pip install 'ppl_bdl[numpyro]')."
        ) from None
    return numpyro_funsor


def scan(fn, init, xs, length: int):
    """``numpyro.contrib.control_flow.scan``: sites in ``fn`` are stacked over the steps."""
    return _scan(fn, init, xs, length=length)


def markov(steps):
    """``numpyro.contrib.funsor.markov`` over ``steps``: each step sees the one before."""
    return _funsor().markov(steps)


def enumerated_log_density(model, inputs, max_plate_nesting: int):
    """log p of ``model(inputs)`` with its sites marked for enumeration summed out."""
    nf = _funsor()
    enumerated = nf.enum(lambda: model(inputs), first_available_dim=-1 - max_plate_nesting)
    value, _ = nf.log_density(enumerated, (), {}, {})
    return value


def infer_discrete(model, inputs, max_plate_nesting: int, key) -> dict:
    """One draw of the enumerated sites of ``model(inputs)`` from their conditional
    distribution given everything else (forward filtering, backward sampling)."""
    nf = _funsor()
    sampler = nf.infer_discrete(
        lambda: model(inputs),
        first_available_dim=-1 - max_plate_nesting,
        temperature=1,
        rng_key=key,
    )
    with handlers.trace() as trace:
        sampler()
    return {
        name: site["value"]
        for name, site in trace.items()
        if site["type"] == "sample" and (site.get("infer") or {}).get("enumerate") == "parallel"
    }
