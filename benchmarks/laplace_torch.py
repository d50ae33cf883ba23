"""Our Laplace approximation beside laplace-torch's (Daxberger et al. 2021) on one small network:
the same MAP weights handed to both, then the posterior precision (``hessian="full"`` and
``"kron"``) and the GLM predictive's sd compared entry by entry, in float64.

    pip install --no-deps --target /tmp/ltpkgs laplace-torch curvlinops-for-pytorch \\
        backpack-for-pytorch torchmetrics lightning-utilities einops einconv \\
        linear_operator unfoldNd            # and asdl (github.com/kazukiosawa/asdl)
    PYTHONPATH=$PWD python benchmarks/laplace_torch.py --laplace-path /tmp/ltpkgs

The networks: a 4-50-1 tanh regression MLP (301 weights, Normal likelihood of fixed sd σ) and
a 2-20-3 tanh classifier (123 weights, Categorical); every weight has a Normal(0, s) prior.
The conventions matched: laplace-torch's ``prior_precision`` is 1/s², its ``sigma_noise`` is
σ, ``temperature=1``; it sums the GGN over the whole training set (its KFAC input factor is
the mean over the data, as ours). Our GLM predictive is a Monte Carlo average over draws; here
it is given the 2k "sigma points" θ* ± √k S e_i (S Sᵀ = P⁻¹), whose variance through a
linear function is exactly J P⁻¹ Jᵀ, so it can be compared with laplace-torch's closed form.

laplace-torch keeps a Dense layer's bias in a block of its own (its weight block is G ⊗ A, its
bias block G); ours keeps W̃ = [W; b] in one block (A augmented with the input's constant 1,
Martens & Grosse 2015), so our kron precision also has the weight-bias cross terms
(Σ x / N) ⊗ G. The kron rows compare the blocks both have, print the cross terms' size, and
compare the predictive sd with our cross terms dropped.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from importlib.metadata import version

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.inference.setup import prepare

SIGMA, PRIOR, HIDDEN = 0.3, 1.0, 50
INSTALL = (
    "laplace-torch is not importable. Install it beside (never over) torch with\n"
    "  pip install --no-deps --target /tmp/ltpkgs laplace-torch curvlinops-for-pytorch "
    "backpack-for-pytorch torchmetrics lightning-utilities einops einconv linear_operator "
    "unfoldNd\n  (and asdl from github.com/kazukiosawa/asdl, the same way), then pass "
    "--laplace-path /tmp/ltpkgs."
)


@bdl.model
def regression(X, y=None):
    f = nn.MLP("net", [X.shape[1], HIDDEN, 1], activation="tanh", prior=PRIOR).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], SIGMA), obs=None if y is None else y[idx])


@bdl.model
def classifier(X, y=None):
    f = nn.MLP("net", [X.shape[1], 20, 3], activation="tanh", prior=PRIOR).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=None if y is None else y[idx])


def data(seed: int = 0) -> dict:
    """The regression and classification data (inputs, targets, and test inputs).

    >>> sorted(data())
    ['classification', 'regression', 'test']
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(200, 4))
    y = np.sin(X @ np.array([1.0, -0.5, 0.3, 0.8])) + SIGMA * rng.normal(size=200)
    Xc = rng.normal(size=(150, 2))
    yc = (Xc[:, 0] > 0).astype(int) + (Xc[:, 1] > 0.5).astype(int)
    return {"regression": (X, y), "classification": (Xc, yc), "test": rng.normal(size=(20, 4))}


def torch_order(layout) -> np.ndarray:
    """``perm`` with ``ours[perm]`` = torch's ``parameters_to_vector`` order (each Linear's
    weight (out, in), then its bias; ours lays a weight out (in, out))."""
    perm = []
    for slot in layout.slots:
        run = np.arange(slot.offset, slot.offset + slot.size)
        perm.append(run.reshape(slot.shape).T.ravel() if len(slot.shape) == 2 else run)
    return np.concatenate(perm)


def torch_net(values: dict, sizes, torch):
    """A torch MLP (tanh) holding our MAP weights ``values`` (site name -> array)."""
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        linear = torch.nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            linear.weight.copy_(torch.as_tensor(values[f"net.{i}.weight"].T))
            linear.bias.copy_(torch.as_tensor(values[f"net.{i}.bias"]))
        layers += [linear, torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def their_laplace(net, X, y, likelihood: str, structure: str, torch, laplace):
    """laplace-torch's Laplace (all weights) fitted at ``net``'s weights."""
    targets = torch.as_tensor(y)[:, None] if likelihood == "regression" else torch.as_tensor(y)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.as_tensor(X), targets), batch_size=64
    )
    la = laplace.Laplace(
        net,
        likelihood,
        subset_of_weights="all",
        hessian_structure=structure,
        sigma_noise=SIGMA if likelihood == "regression" else 1.0,
        prior_precision=1.0 / PRIOR**2,
        temperature=1.0,
    )
    la.fit(loader)
    return la


def our_laplace(bound, backend: str, structure: str, init: dict):
    """Our Laplace fit at the MAP ``init`` (no optimizer steps), in float64."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ten draws: the ESS warnings say so
        return _our_fit(bound, backend, structure, init)


def _our_fit(bound, backend: str, structure: str, init: dict):
    return bdl.fit(
        bound,
        backend=backend,
        method="laplace",
        precision="float64",
        num_steps=0,
        init=init,
        hessian=structure,
        batch_size=64,
        num_samples=10,
        progress=False,
    )


def sigma_point_sd(post, bound, precision: np.ndarray) -> np.ndarray:
    """Our GLM predictive's sd with the draws θ* ± √k S e_i (S Sᵀ = precision⁻¹)."""
    guide = dataclasses.replace(post.guide)
    k = len(guide.index)
    root = np.linalg.inv(np.linalg.cholesky(precision)).T  # L⁻ᵀ: (L⁻ᵀ)(L⁻ᵀ)ᵀ = P⁻¹
    points = np.repeat(guide.mode[None], 2 * k, axis=0)
    points[:k, guide.index] += np.sqrt(k) * root.T
    points[k:, guide.index] -= np.sqrt(k) * root.T
    guide.fit_draws = lambda: points
    return dataclasses.replace(post, guide=guide).predict(bound, pred_type="glm").sd


def differences(ours: np.ndarray, theirs: np.ndarray) -> str:
    """Max abs and max relative (to the largest entry) difference."""
    gap = np.max(np.abs(ours - theirs))
    return f"max abs {gap:.2e}, rel {gap / np.max(np.abs(theirs)):.2e}"


def compare(name, bound, test, X, y, likelihood, backend, modules) -> None:
    """Print, for full and kron, our precision's and predictive sd's gaps to laplace-torch's
    (``modules``: torch and laplace)."""
    torch, laplace = modules
    setup = prepare(bound, backend, "float64", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = bdl.fit(
            bound,
            backend="numpyro",
            method="laplace",
            precision="float64",
            num_steps=3000,
            lr=0.01,
            num_samples=1,
            progress=False,
        )
    values = {k: np.asarray(v) for k, v in setup.layout.unflatten(start.guide.mode).items()}
    perm = torch_order(setup.layout)
    sizes = [X.shape[1]] + [values[f"net.{i}.bias"].size for i in range(2)]
    for structure in ("full", "kron"):
        la = their_laplace(
            torch_net(values, sizes, torch), X, y, likelihood, structure, torch, laplace
        )
        post = our_laplace(bound, backend, structure, values)
        mine = post.guide.precision if structure == "full" else post.guide.precision_matrix()
        mine = mine[np.ix_(perm, perm)]
        theirs = la.posterior_precision
        theirs = (theirs if structure == "full" else theirs.to_matrix()).detach().numpy()
        cross = np.zeros_like(mine, bool)
        if structure == "kron":  # the blocks laplace-torch has: ours less the W-b cross terms
            cross = (theirs == 0) & (mine != 0)
            largest, scale = np.max(np.abs(mine[cross])), np.max(np.abs(theirs))
            print(
                f"  {name} {backend:>7} kron: our weight-bias cross terms up to {largest:.3g} "
                f"({largest / scale:.2g} of the largest entry)"
            )
        gaps = differences(np.where(cross, 0.0, mine), theirs)
        print(f"  {name} {backend:>7} {structure}: precision {gaps}")
        if likelihood != "regression":
            continue
        f_mu, f_var = la(torch.as_tensor(test), pred_type="glm")
        their_sd = np.sqrt(f_var.detach().numpy()[:, 0, 0] + SIGMA**2)
        ours = np.where(cross, 0.0, mine)[np.ix_(np.argsort(perm), np.argsort(perm))]
        label = "sd" if structure == "full" else "sd (cross terms dropped)"
        sd = sigma_point_sd(post, regression(test), ours)
        print(f"  {name} {backend:>7} {structure}: predictive {label} {differences(sd, their_sd)}")
        if structure == "kron":  # ours as it is: the cross terms' effect
            whole = mine[np.ix_(np.argsort(perm), np.argsort(perm))]
            sd = sigma_point_sd(post, regression(test), whole)
            print(f"  {name} {backend:>7} kron: predictive sd (ours) {differences(sd, their_sd)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--laplace-path", default=None, help="where laplace-torch is installed")
    parser.add_argument("--backend", default="both", choices=("numpyro", "pyro", "both"))
    args = parser.parse_args()
    if args.laplace_path:
        sys.path.append(args.laplace_path)  # after the site packages: it never shadows torch
    try:
        import laplace
        import torch
    except ImportError as error:
        raise SystemExit(f"{INSTALL}\n({error})") from None
    torch.set_default_dtype(torch.float64)
    sets, modules = data(), (torch, laplace)
    backends = ("numpyro", "pyro") if args.backend == "both" else (args.backend,)
    print(f"laplace-torch {version('laplace-torch')}, torch {torch.__version__}")
    for backend in backends:
        X, y = sets["regression"]
        compare("regression", regression(X, y), sets["test"], X, y, "regression", backend, modules)
        Xc, yc = sets["classification"]
        compare("classifier", classifier(Xc, yc), None, Xc, yc, "classification", backend, modules)


if __name__ == "__main__":
    main()
