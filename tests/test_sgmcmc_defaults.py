"""SG-MCMC at its defaults fits a small BNN regression's noise scale."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.models import bnn, regression

pytest.importorskip("numpyro")


@pytest.mark.slow
@pytest.mark.parametrize(
    "method",
    [
        "sgld",
        "sghmc",
        "psgld",
        "csghmc",
        "csgld",  # 35% high with 5,000 warmup steps on seed 0 (still settling): 10,000 now
    ],
)
def test_defaults_fit_the_noise_scale(method):
    X, y = regression.make_sine_data(n=120)  # true noise sigma 0.15
    bound = bnn.make_bnn_regression(hidden=(16,))(X, y)
    post = bdl.fit(bound, backend="numpyro", method=method, seed=0, progress=False)
    sigma = float(np.mean(post.samples["sigma"]))
    assert abs(sigma - 0.15) / 0.15 < 0.3, sigma
