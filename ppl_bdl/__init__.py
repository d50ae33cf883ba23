"""ppl_bdl: write a Bayesian model once, run it on Pyro or NumPyro, read it in ArviZ.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def linreg(X, y=None):
...     w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
...     sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(X[idx] @ w, sigma), obs=None if y is None else y[idx])
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(50, 2)); y = X @ np.array([1.0, -1.0]) + 0.3 * rng.normal(size=50)
>>> post = bdl.fit(linreg(X, y), backend="numpyro", method="nuts", num_warmup=200,
...                num_samples=200, num_chains=1, progress=False)
>>> post.samples["w"].shape
(1, 200, 2)
"""

from ppl_bdl import backends, dist, guides, kernels, math, nn, random
from ppl_bdl.dsl.control_flow import scan
from ppl_bdl.dsl.model import BoundModel, Model, model
from ppl_bdl.dsl.primitives import deterministic, factor, param, plate, sample
from ppl_bdl.dsl.reparam import LocScale, Reparam, TransformReparam, reparam
from ppl_bdl.errors import (
    BackendError,
    ConfigError,
    DataError,
    DistributionError,
    InferenceError,
    ModelError,
    PPLError,
    RunInterrupted,
)
from ppl_bdl.inference import diffusion, ebm
from ppl_bdl.inference.cavi.method import CAVI
from ppl_bdl.inference.ensemble import Ensemble
from ppl_bdl.inference.laplace import Laplace
from ppl_bdl.inference.mc_dropout import MCDropout
from ppl_bdl.inference.mcmc.methods import (
    HMC,
    NUTS,
    PSGLD,
    SGHMC,
    SGLD,
    SGMCMC,
    CyclicalSGHMC,
    CyclicalSGLD,
)
from ppl_bdl.inference.mcmc.native_kernel import native_kernel
from ppl_bdl.inference.mcmc.replica_exchange import ReSGHMC, ReSGLD
from ppl_bdl.inference.method import Method
from ppl_bdl.inference.swag import SWAG
from ppl_bdl.inference.vi.guides.custom import guide
from ppl_bdl.inference.vi.method import VI
from ppl_bdl.posterior.chains import merge_chains
from ppl_bdl.posterior.diagnostics import ConvergenceError, ConvergenceWarning, Diagnostics
from ppl_bdl.posterior.posterior import Posterior
from ppl_bdl.posterior.predictive import PredictiveResult, prior_predictive
from ppl_bdl.run.executor import InProcessExecutor
from ppl_bdl.run.fit import CostWarning, fit
from ppl_bdl.run.persistence import load
from ppl_bdl.run.process_executor import DeviceExecutor
from ppl_bdl.run.ray_executor import RayExecutor

__version__ = "0.1.0"

__all__ = [
    "CAVI",
    "CyclicalSGHMC",
    "CyclicalSGLD",
    "Ensemble",
    "Laplace",
    "HMC",
    "MCDropout",
    "Method",
    "NUTS",
    "PSGLD",
    "ReSGHMC",
    "ReSGLD",
    "SGHMC",
    "SGLD",
    "SGMCMC",
    "SWAG",
    "VI",
    "BackendError",
    "BoundModel",
    "ConfigError",
    "ConvergenceError",
    "ConvergenceWarning",
    "CostWarning",
    "Diagnostics",
    "DataError",
    "DeviceExecutor",
    "DistributionError",
    "InProcessExecutor",
    "InferenceError",
    "LocScale",
    "Model",
    "ModelError",
    "PPLError",
    "Posterior",
    "PredictiveResult",
    "RayExecutor",
    "Reparam",
    "RunInterrupted",
    "TransformReparam",
    "backends",
    "deterministic",
    "diffusion",
    "dist",
    "ebm",
    "factor",
    "fit",
    "guide",
    "guides",
    "kernels",
    "load",
    "math",
    "merge_chains",
    "model",
    "native_kernel",
    "nn",
    "param",
    "plate",
    "prior_predictive",
    "random",
    "reparam",
    "sample",
    "scan",
]
