"""Linear regression with NUTS: the fitted line and its 90% predictive band."""

import argparse
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # drawn off-screen (Agg): no display needed

import ppl_bdl as bdl
from ppl_bdl.models import regression

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the picture")
out = parser.parse_args().out

rng = np.random.default_rng(0)
X = rng.uniform(-2.0, 2.0, size=(40, 1))
y = 0.5 + 1.5 * X[:, 0] + 0.4 * rng.normal(size=40)

model = regression.linear_regression  # y ~ N(b + X @ w, sigma), w, b, sigma with priors
post = bdl.fit(
    model(X, y),
    backend="numpyro",
    method="nuts",
    num_warmup=500,
    num_samples=500,
    num_chains=2,
    seed=0,
    progress=False,
)
print(post.summary())  # mean, sd, HDI, ESS, R-hat of w, b and sigma

grid = np.linspace(-2.5, 2.5, 100)[:, None]
pred = post.predict(model(grid))  # new draws of y at the grid, from every posterior draw
lo, hi = pred.interval(0.9)

fig = Figure(figsize=(6, 4), layout="tight")
ax = fig.subplots()
ax.fill_between(grid[:, 0], lo, hi, alpha=0.3, label="90% predictive interval")
ax.plot(grid[:, 0], pred.mean, label="predictive mean")
ax.scatter(X[:, 0], y, s=12, color="k", label="data")
ax.set(xlabel="x", ylabel="y", title="Linear regression (NUTS on NumPyro)")
ax.legend()
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "linear_regression.png", dpi=100)
