"""A Bayesian LeNet-5 on synthetic images, sampled with SGLD: predictions and their confidence.

Each test image is shown with the predicted class and its posterior-mean probability; the
reliability diagram compares the confidence of the predictions with their accuracy (here the
posterior of a network fitted to 300 images is under-confident: its accuracy exceeds its
confidence).
"""

import argparse
from pathlib import Path

from matplotlib.figure import Figure  # drawn off-screen (Agg): no display needed

import ppl_bdl as bdl
from ppl_bdl.models import images, vision
from ppl_bdl.posterior.metrics import expected_calibration_error, reliability_diagram

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the picture")
out = parser.parse_args().out

X, y = images.make_synthetic_images(n=300, num_classes=4, size=12, seed=0)  # (300, 1, 12, 12)
X_test, y_test = images.make_synthetic_images(n=200, num_classes=4, size=12, seed=1)
model = vision.make_lenet5_classifier(image_size=12, num_classes=4)  # He priors on the weights
post = bdl.fit(
    model(X, y),
    backend="pyro",
    method="sgld",
    step_size=1e-3,
    num_warmup=300,
    num_samples=20,
    thinning=5,
    num_chains=1,
    batch_size=50,
    init="prior",
    seed=0,
    progress=False,
)
pred = post.predict(model(X_test))  # pred.probs: posterior-mean class probabilities
label = pred.probs.argmax(-1)
right = label == y_test
print(f"held-out accuracy {right.mean():.2f} (chance 0.25)")

fig = Figure(figsize=(8, 4), layout="tight")
grid = fig.add_gridspec(2, 6)
for k in range(8):
    ax = fig.add_subplot(grid[k // 4, k % 4])
    ax.imshow(X_test[k, 0], cmap="gray")
    ax.set_title(f"{label[k]} ({pred.probs[k].max():.2f})", color="C2" if right[k] else "C3")
    ax.set_axis_off()
ax = reliability_diagram(pred.probs, y_test, num_bins=10, ax=fig.add_subplot(grid[:, 4:]))
ax.set_title(f"ECE {expected_calibration_error(pred.probs, y_test, num_bins=10):.2f}")
fig.suptitle("LeNet-5, SGLD (Pyro): predicted class (probability)")
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "image_classifier.png", dpi=100)
