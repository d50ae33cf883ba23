"""Fits that tests/test_scale.py runs twice: on one device in the test process, and on JAX's
virtual CPU devices in a subprocess (``python tests/scale_fits.py OUT DEVICE SHARD NAME...``,
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX starts; DEVICE
``cpu:0,cpu:1`` is the list ``["cpu:0", "cpu:1"]``), or on torch
in each of the gloo processes of a data-parallel fit (``python tests/scale_fits.py --torch OUT
NAME...`` with torch.distributed's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set). Each fit's
draws of ``w`` (chain, draw, 2) are saved to ``OUT`` (NumPy's npz), with the VI losses; a fit
that fails saves its error's message and the draws it kept instead."""

from __future__ import annotations

import sys
import warnings

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm


@bdl.model
def regression(x, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    with bdl.plate("data", x.shape[0]) as idx:
        bdl.sample("y", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


@bdl.model
def cliff():
    """N(0, 1) where x < 1.5; NaN beyond: a chain that walks past 1.5 fails there."""
    x = bdl.sample("x", dist.Normal(0.0, 1.0))
    bdl.factor("cliff", bm.where(x < 1.5, 0.0, np.nan))


def data(n: int = 64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2))
    return x, x @ np.array([1.0, -2.0]) + 0.5 * rng.normal(size=n)


_SG = dict(step_size=1e-3, batch_size=8, num_warmup=20, num_samples=20)
_VI = dict(method="vi", num_steps=60, lr=0.05, batch_size=8, num_samples=10)
#: name -> fit options. 5 chains (3 fits for VI) on 4 devices: a number that does not divide.
FITS = {
    **{k: dict(method=k, num_chains=5, **_SG) for k in ("sgld", "sghmc", "psgld")},
    **{k: dict(method=k, num_chains=5, num_cycles=2, **_SG) for k in ("csgld", "csghmc")},
    "nuts": dict(method="nuts", num_chains=5, num_warmup=30, num_samples=20),
    # HMC without warmup: split or not, its draws agree to the bit. With 30 warmup steps they
    # differ by up to 1e-2: a last-digit difference in the adaptation's arithmetic between the
    # two programs, carried through the early trajectories (its adaptation is per chain).
    "hmc": dict(
        method="hmc", num_chains=3, num_warmup=0, num_samples=20, num_steps=5, step_size=0.3
    ),
    **{f"vi_{g}": dict(guide=g, num_chains=3, **_VI) for g in bdl.guides.available()},
    # ensembles: 5 members (their chains), plain and anchored (w's N(0, 1) prior)
    "ensemble": dict(method="ensemble", num_members=5, num_steps=60, lr=0.05, batch_size=8),
    "ensemble_anchored": dict(
        method="ensemble", num_members=5, num_steps=60, lr=0.05, batch_size=8, anchored=True
    ),
    # shard="data": one chain or a few, each minibatch of 8 split over the devices
    "sgld_data": dict(method="sgld", num_chains=1, **_SG),
    "sghmc_data": dict(method="sghmc", num_chains=2, **_SG),
    "vi_data": dict(guide="meanfield", **_VI),
    # a chain that fails on a split run: the step and chain named as on one device
    "cliff": dict(
        method="sgld", step_size=0.05, num_warmup=0, num_samples=400, num_chains=6, init={"x": -0.5}
    ),
}


def run(names, device=None, shard=None, backend="numpyro") -> dict[str, np.ndarray]:
    """The fits ``names`` on ``device`` (split as ``shard`` says; "auto": "data" for the fits
    named ``*_data``, chains for the others): draws, losses or the error."""
    out = {}
    for name in names:
        options = dict(FITS[name])
        split = ("data" if name.endswith("_data") else None) if shard == "auto" else shard
        bound = cliff() if name == "cliff" else regression(*data())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # short runs: the convergence checks complain
            try:
                post = bdl.fit(
                    bound, backend=backend, device=device, shard=split, progress=False, **options
                )
            except bdl.InferenceError as err:
                out[f"{name}/error"] = np.asarray(str(err))
                if err.partial is not None:
                    out[f"{name}/partial"] = err.partial.samples["x"]
                continue
        out[name] = post.samples["w" if "w" in post.samples else "x"]
        if post.losses is not None:
            out[f"{name}/losses"] = np.asarray(post.losses)
    return out


def main(argv: list[str]) -> None:
    if argv[0] == "--torch":  # one of torch.distributed's processes (RANK, WORLD_SIZE, ...)
        import os

        path, *names = argv[1:]
        world = int(os.environ["WORLD_SIZE"])
        np.savez(path, **run(names, ["cpu"] * world, "data", backend="pyro"))
        return
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    path, device, shard, *names = argv
    devices = device.split(",") if "," in device else device  # "cpu:0,cpu:1": a list
    results = run(names, device=devices, shard=None if shard == "-" else shard)
    results["devices"] = np.asarray(len(jax.devices()))
    np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1:])
