"""Eight schools (Rubin 1981), non-centred, with NUTS: each school's effect shrunk to the mean."""

import argparse
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # drawn off-screen (Agg): no display needed

import ppl_bdl as bdl
from ppl_bdl.models import posteriordb

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the picture")
out = parser.parse_args().out

data = posteriordb.eight_schools_data()  # J, sigma, y: shipped with the package
model = posteriordb.eight_schools_noncentered  # theta = mu + tau * theta_trans
post = bdl.fit(
    model(**data),
    backend="numpyro",
    method="nuts",
    num_warmup=500,
    num_samples=500,
    num_chains=4,
    target_accept=0.9,
    seed=0,
    progress=False,
)
print(post.summary(var_names=["mu", "tau", "theta"]))

theta = post.samples["theta"].reshape(-1, data["J"])  # (chains x draws, J)
lo, mid, hi = np.percentile(theta, [5, 50, 95], axis=0)
rows = np.arange(data["J"])

fig = Figure(figsize=(7, 5), layout="tight")
ax = fig.subplots()
ax.errorbar(
    data["y"],
    rows + 0.15,
    xerr=data["sigma"],
    fmt="s",
    color="gray",
    label="observed effect ± its standard error",
)
ax.errorbar(
    mid, rows - 0.15, xerr=[mid - lo, hi - mid], fmt="o", label="posterior median, 90% interval"
)
ax.axvline(np.median(post.samples["mu"]), color="k", lw=1, ls="--", label="posterior median of mu")
ax.set(
    yticks=rows,
    yticklabels=[f"school {j + 1}" for j in rows],
    xlabel="treatment effect",
    title="Eight schools (NUTS on NumPyro)",
)
ax.invert_yaxis()
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, fontsize="small")
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "eight_schools.png", dpi=100)
