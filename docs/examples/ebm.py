"""An energy-based model of three Gaussian blobs, trained with Langevin chains (SGLD).

Left: the learned energy E(x) (low where the data are) with the data; right: fresh samples of
the trained model, from its persistent chains.
"""

import argparse
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # drawn off-screen (Agg): no display needed

import ppl_bdl as bdl
from ppl_bdl import nn
from ppl_bdl.models.ebm import gaussian_mixture_2d

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the picture")
out = parser.parse_args().out

X = gaussian_mixture_2d(2000, seed=0)  # three Gaussian blobs in the plane
energy = nn.MLP("energy", [2, 32, 32, 1], activation="silu", prior=nn.he_normal())
model = bdl.ebm.fit(
    energy,
    X,
    backend="numpyro",
    sampler="sgld",
    chain_steps=10,
    step_size=0.01,
    persistent=True,
    batch_size=100,
    num_steps=300,
    lr=3e-3,
    seed=0,
)
x = model.sample(1000, steps=10)  # the persistent chains, run on at the trained energy

u, v = np.meshgrid(np.linspace(-3, 3, 80), np.linspace(-3, 3, 80))
E = model.energy(np.column_stack([u.ravel(), v.ravel()])).reshape(u.shape)

fig = Figure(figsize=(8, 4), layout="tight")
left, right = fig.subplots(1, 2, sharex=True, sharey=True)
left.contourf(u, v, E, levels=20, cmap="viridis")
left.scatter(X[:500, 0], X[:500, 1], s=2, color="w", alpha=0.5)
left.set(title="energy E(x) and data", xlabel="x1", ylabel="x2")
right.scatter(x[:, 0], x[:, 1], s=2, alpha=0.5)
right.set(title="samples of the model", xlabel="x1", aspect="equal")
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "ebm.png", dpi=100)
