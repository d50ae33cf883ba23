"""A Bayesian neural network on a sine with a gap: cyclical SGHMC and its predictive band.

The band widens in the gap between the two clouds of data, where the network has seen nothing:
that is the epistemic part of the predictive variance (``pred.epistemic``).
"""

import argparse
import warnings
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # drawn off-screen (Agg): no display needed

import ppl_bdl as bdl
from ppl_bdl.models import bnn, regression

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the picture")
out = parser.parse_args().out

X, y = regression.sine_data()  # 80 points of a noisy sine, none in (-0.8, 0.8)
model = bnn.make_bnn_regression(hidden=(20,))  # 20 tanh units, N(0, 1) weights
# Each chain of cyclical SG-MCMC explores its own modes of the network's posterior, so R-hat across
# chains is large by design (the SG-MCMC page explains); judge the fit by its predictions.
warnings.simplefilter("ignore", bdl.ConvergenceWarning)
post = bdl.fit(
    model(X, y),
    backend="numpyro",
    method="sghmc",
    schedule="cyclical",
    num_cycles=4,
    batch_size=20,
    init="median",
    num_warmup=800,
    num_samples=200,
    thinning=4,
    num_chains=4,
    seed=0,
    progress=False,
)

grid = np.linspace(-4.0, 4.0, 200)[:, None]
pred = post.predict(model(grid))
lo, hi = pred.interval(0.9)
print(f"rmse on the data: {post.predict(model(X)).rmse(y):.3f} (y sd {y.std():.3f})")

fig = Figure(figsize=(6, 4), layout="tight")
ax = fig.subplots()
ax.fill_between(grid[:, 0], lo, hi, alpha=0.3, label="90% predictive interval")
ax.plot(grid[:, 0], pred.mean, label="predictive mean")
ax.plot(grid[:, 0], np.sin(1.5 * grid[:, 0]), "k--", lw=1, label="sin(1.5 x)")
ax.scatter(X[:, 0], y, s=10, color="k", label="data")
ax.set(xlabel="x", ylabel="y", ylim=(-3, 3), title="BNN, cyclical SGHMC (NumPyro)")
ax.legend(loc="lower right", fontsize="small")
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "bnn_regression.png", dpi=100)
