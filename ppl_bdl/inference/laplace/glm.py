"""The linearised ("GLM") predictive of a Laplace posterior: ``post.predict(m(X), pred_type="glm")``.

Immer, Korzepa & Bauer (2021, Eq. 6) predict with the model linearised at the MAP,

    f_lin(x, θ) = f(x, θ*) + J(x) (θ − θ*),

whose curvature is the GGN the Laplace fit used: the outputs f (the likelihood's
location-type parameter: :data:`~ppl_bdl.inference.laplace.potentials.OUTPUTS`) of each
predicted site are replaced by f_lin at every draw θ of the Gaussian, and the likelihood is then
drawn as usual (its moments summarised as for ``pred_type="nn"``). J(x)(θ − θ*) is one ``jvp``
per draw; the Jacobian is never formed. For a model whose outputs are linear in θ the two
predictives are the same.
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.errors import ModelError
from ppl_bdl.inference.laplace.potentials import OUTPUTS, OutputEvaluator
from ppl_bdl.posterior.predictive_runner import MAX_DRAWS_PER_CALL
from ppl_bdl.posterior.predictive_runner import _draws_and_moments as draws_and_moments
from ppl_bdl.trace.layout import LatentLayout


def glm_predictive(approx, bound, backend, sites, num_samples, seed, params) -> tuple[dict, dict]:
    """Draws and moments (as :func:`~ppl_bdl.posterior.predictive_runner.run_predictive`
    returns them) of the sites ``bound`` predicts, with their outputs linearised at θ*, one
    per draw of ``approx`` (the fit's draws, or ``num_samples`` new ones)."""
    latent = set(approx.settings.get("latent", ()))
    layout = LatentLayout.from_sites({n: s for n, s in sites.items() if n in latent}, backend)
    if layout.dim != len(approx.mode):
        raise ModelError(
            f"pred_type='glm': model {bound.name!r} lays its latent sites {layout.names} out in "
            f"{layout.dim} unconstrained coordinates; the Laplace fit had {len(approx.mode)}. "
            "Predict with the model the posterior was fitted to."
        )
    flat = approx.fit_draws() if num_samples is None else approx.sample(num_samples, seed + 1)
    data, template = bound.data_arrays(backend)
    key = ("laplace-glm", backend.name, backend.precision, backend.device, repr(template))
    # the layout's slots (their shapes): the compiled run keeps the layout; the data and params
    # are its arguments (a new shape of those is traced again)
    key += (tuple(layout.slots), tuple(sorted(params)))
    cache = bound.model.compiled
    if key not in cache:
        cache[key] = _linearised_run(bound, backend, layout, template)
    arrays = (data, {k: backend.asarray(v) for k, v in params.items()})
    return _in_chunks(backend, cache[key], flat, approx.mode, arrays, seed)


def _linearised_run(bound, backend, layout, template):
    """``one(theta, key, mode, (data, params))``: the predicted sites' draws and moments at
    one draw θ, their outputs linearised at ``mode`` (θ*); vmapped over draws and compiled."""
    skip = dict.fromkeys(layout.names)

    def run(theta, key, arrays, outputs=None):
        data, params = arrays
        ev = OutputEvaluator(
            backend,
            unconstrained=layout.unflatten(theta, backend),
            params=params,
            key=key,
            predictive=True,
            missing="prior",
            record=True,
            outputs=outputs,
        )
        bound.run_with(ev, fill_data(template, data))
        return ev.sites

    def one(theta, key, mode, arrays):
        fstar, jv = backend.jvp(
            lambda t: _outputs(run(t, key, arrays), skip), (mode,), (theta - mode,)
        )
        lin = {s: {k: fstar[s][k] + jv[s][k] for k in fstar[s]} for s in fstar}
        return draws_and_moments(run(theta, key, arrays, lin), skip)

    return backend.jit(backend.vmap(one, in_axes=(0, 0, None, None)))


def _outputs(sites: dict, skip: dict) -> dict:
    """Each predicted site's outputs (:data:`OUTPUTS`) in a recorded run (the sites in
    ``skip``, the posterior's, are not predicted)."""
    out = {}
    for name, site in sites.items():
        if name not in skip and site.kind in ("latent", "observed") and site.spec is not None:
            keys = OUTPUTS.get(site.spec.name, ())
            found = {k: site.spec.params[k] for k in keys if k in site.spec.params}
            if found:
                out[name] = found
    return out


def _in_chunks(backend, compiled, flat: np.ndarray, mode: np.ndarray, arrays, seed: int):
    """``compiled`` over the draws, ``MAX_DRAWS_PER_CALL`` draws per call."""
    total = len(flat)
    per_call = max(1, min(total, MAX_DRAWS_PER_CALL))
    draws: dict[str, list] = {}
    moments: dict[str, dict[str, list]] = {}
    with backend.scope(), backend.activate():
        anchor = backend.asarray(mode)
        for start in range(0, total, per_call):
            rows = flat[start : start + per_call]
            real = len(rows)
            rows = np.concatenate([rows, np.repeat(rows[-1:], per_call - real, axis=0)])
            keys = backend.random.keys(backend.random.key(seed + start), per_call)
            d, m = compiled(backend.asarray(rows), keys, anchor, arrays)
            for k, v in d.items():
                draws.setdefault(k, []).append(backend.to_numpy(v)[:real])
            for k, v in m.items():
                for n, a in v.items():
                    moments.setdefault(k, {}).setdefault(n, []).append(backend.to_numpy(a)[:real])
    return (
        {k: np.concatenate(v) for k, v in draws.items()},
        {k: {n: np.concatenate(a) for n, a in v.items()} for k, v in moments.items()},
    )
