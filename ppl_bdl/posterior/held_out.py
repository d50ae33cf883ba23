"""Score a posterior on held-out data: ``post.evaluate(model(X_test, y_test))``.

The model is replayed at the new inputs once per posterior draw (:meth:`Posterior.predict`); the
predicted site's observed values in the bound model are the targets. A Categorical or Bernoulli
site is scored by :func:`ppl_bdl.posterior.metrics.classification_metrics`, any other by
:func:`ppl_bdl.posterior.metrics.regression_metrics`.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.models import bnn
>>> X, y = bnn.make_blobs(n=30, num_classes=3, seed=0)
>>> model = bnn.make_bnn_classification(hidden=(4,))
>>> post = bdl.fit(model(X, y, num_classes=3), backend="pyro", method="vi", num_steps=200,
...                num_samples=20, progress=False)
>>> scores = post.evaluate(model(X, y, num_classes=3))
>>> sorted(scores)  # doctest: +NORMALIZE_WHITESPACE
['accuracy', 'brier', 'ece', 'expected_entropy', 'mutual_information', 'nll',
 'predictive_entropy']
>>> scores["accuracy"] > 0.8
True
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.model import BoundModel, unbound_message
from ppl_bdl.errors import DataError, ModelError
from ppl_bdl.posterior.metrics import classification_metrics, regression_metrics
from ppl_bdl.trace.model_trace import trace_model


def observed_values(bound, site: str, backend) -> np.ndarray:
    """The data ``bound`` conditions ``site`` on, as a NumPy array; a DataError if it has none."""
    sites = trace_model(bound, backend, missing="uniform")
    record = sites.get(site)
    if record is None or record.kind != "observed":
        observed = [n for n, s in sites.items() if s.kind == "observed"]
        raise DataError(
            f"site {site!r} has no observed values in {bound.name!r}, so there is nothing to score "
            f"the predictions against (observed sites: {observed}). Bind the held-out targets, "
            f"e.g. post.evaluate({bound.name}(X_test, y_test)), not {bound.name}(X_test)."
        )
    return np.asarray(backend.to_numpy(record.value))


def evaluate(
    posterior,
    bound,
    num_samples: int | None = None,
    seed: int = 0,
    site: str | None = None,
    num_bins: int = 15,
    binning: str = "equal_width",
    pred_type: str = "nn",
) -> dict[str, float]:
    """Metric name -> value of ``posterior``'s predictions of ``site`` against ``bound``'s data.

    Parameters
    ----------
    posterior : Posterior
    bound : BoundModel
        The model with held-out inputs *and* targets, ``model(X_test, y_test)``.
    num_samples, seed, site
        As in :meth:`Posterior.predict` (default site: the last predicted site, the likelihood).
    num_bins, binning
        The ECE's bins (classification only), see
        :func:`ppl_bdl.posterior.metrics.expected_calibration_error`.
    pred_type
        As in :meth:`Posterior.predict`: "nn", or for a Laplace fit "glm" (the model linearised
        at the MAP).

    Returns
    -------
    dict
        Classification: accuracy, nll, brier, ece, predictive_entropy, expected_entropy,
        mutual_information. Regression: rmse, nll, total_variance, aleatoric_variance,
        epistemic_variance. Plain floats.
    """
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    result = posterior.predict(
        bound, num_samples=num_samples, seed=seed, site=site, pred_type=pred_type
    )
    if result.site is None or result.kind not in ("classification", "regression"):
        raise DataError(
            f"{bound.name!r} has no site whose predictive distribution can be scored (a "
            "Categorical/Bernoulli site for classification or a continuous one for regression)."
        )
    backend = get_backend(posterior.backend, precision=posterior.precision)
    y = observed_values(bound, result.site, backend)
    if result.kind == "classification":
        return classification_metrics(
            result.per_draw["probs"], y, num_bins=num_bins, binning=binning
        )
    return regression_metrics(result.per_draw["mean"], result.per_draw["variance"], y)
