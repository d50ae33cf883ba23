"""Starting values of a network's weights when they are trained as point estimates (an EBM's
energy, a VAE's encoder or decoder): a lifted module's own values, else one draw of each site's
prior (a fan-scaled prior such as :func:`~ppl_bdl.dsl.nn.he_normal` is a standard initialiser).

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> values = nn.initial_values(nn.Dense("fc", 3, 2, prior=nn.he_normal()),
...                            bdl.backends.get("numpyro"), seed=0)
>>> {k: v.shape for k, v in values.items()}
{'fc.weight': (3, 2), 'fc.bias': (2,)}
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.dsl.nn.lift import Lifted
from ppl_bdl.dsl.nn.module import Module


def initial_values(network: Module, backend, seed: int) -> dict[str, np.ndarray]:
    """Site name -> a starting value (NumPy) of each weight site of ``network`` on ``backend``.

    A lifted module's parameters keep the module's values; every other site gets one draw of
    its prior (site ``i`` from the seed ``seed * 7919 + i``). Give the network a fan-scaled prior
    (``nn.he_normal()``): a weight drawn from the default N(0, 1) makes a wide layer's outputs
    large.
    """
    own = _module_values(network, backend)
    out = {}
    with backend.scope(), backend.activate():
        shapes, priors = dict(network.sites()), dict(network.priors())
        for i, (name, shape) in enumerate(shapes.items()):
            if name in own:
                value = own[name]
            else:
                prior = priors[name]
                # sample_shape + batch_shape is the site's shape (a prior broadcasts to it)
                lead = shape[: len(shape) - len(prior.batch_shape)]
                value = prior.sample(int(seed) * 7919 + i, lead)
            out[name] = np.broadcast_to(np.asarray(backend.to_numpy(value)), shape).copy()
    return out


def _module_values(network: Module, backend) -> dict[str, np.ndarray]:
    if not isinstance(network, Lifted):
        return {}
    parts = backend.lift_module(network.module)
    if parts is None:  # another library's module: its forward pass says which backend
        return {}
    prefix = f"{network.path}." if network.path else ""
    return {prefix + k: np.asarray(backend.to_numpy(v)) for k, v in parts.params.items()}
