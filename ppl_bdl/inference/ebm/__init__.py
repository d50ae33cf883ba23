"""Energy-based models trained with Langevin chains on their inputs (Section 3.1 of "Bayesian Computation in Deep Learning").

:func:`fit` trains an energy network E_θ(x) (a :mod:`ppl_bdl.dsl.nn` network or a lifted module) on
data by Algorithm 3: short runs of a project SG-MCMC kernel on the inputs (``sgld``: Eq. 3.7),
persistent through a replay buffer or restarted, give the negative samples of the
maximum-likelihood gradient (Eq. 3.5). It returns an :class:`EnergyModel` with ``energy(x)`` and
``sample(n)``. See docs/ebm.md.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> X = np.random.default_rng(0).normal(size=(200, 2))
>>> ebm = bdl.ebm.fit(nn.MLP("energy", [2, 16, 1], prior=nn.he_normal()), X,
...                   backend="numpyro", num_steps=20, chain_steps=2)
>>> ebm.sample(10).shape
(10, 2)
"""

from ppl_bdl.inference.ebm.chains import ChainSpec, ReplayBuffer
from ppl_bdl.inference.ebm.model import EnergyModel
from ppl_bdl.inference.ebm.trainer import fit

__all__ = ["ChainSpec", "EnergyModel", "ReplayBuffer", "fit"]
