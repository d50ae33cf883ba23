"""A variational auto-encoder on stroke images, fitted by amortized VI: its 2-D latent space.

The encoder gives each image its q(z | x) (``post.encode``); images of the same stroke angle
land together in the 2-D latent space.
"""

import argparse
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # drawn off-screen (Agg): no display needed

from ppl_bdl.models import images, vae

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the picture")
out = parser.parse_args().out

# The fit: a dense decoder z -> Bernoulli pixel probabilities, its mirror encoder as the amortized
# guide, minibatch ELBO steps with Adam (models/vae.py writes the model in the DSL).
post, X = vae.fit_vae(
    "numpyro",
    n=512,
    size=16,
    latent_dim=2,
    hidden=64,
    num_steps=1500,
    batch_size=64,
    num_samples=2,
    seed=0,
)
_, angle = images.make_stroke_images(n=512, num_classes=4, size=16, noise=0.05, seed=0)
loc, scale = post.encode(X)["z"]  # q(z | x) of every image: (512, 2) each
print(f"negative ELBO: {post.losses[-100:].mean() / len(X):.1f} nats per image")

fig = Figure(figsize=(8, 4), layout="tight")
grid = fig.add_gridspec(2, 4)
ax = fig.add_subplot(grid[:, :2])
points = ax.scatter(loc[:, 0], loc[:, 1], c=angle, s=6, cmap="tab10", vmin=0, vmax=9)
ax.legend(*points.legend_elements(), title="stroke angle", fontsize="small")
ax.set(xlabel="z1", ylabel="z2", title="q(z | x): posterior means")
for k in range(4):
    ax = fig.add_subplot(grid[k // 2, 2 + k % 2])
    ax.imshow(X[int(np.argmax(angle == k)), 0], cmap="gray_r")
    ax.set(title=f"angle {k}")
    ax.set_axis_off()
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "vae.png", dpi=100)
