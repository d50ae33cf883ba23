"""Make an existing network Bayesian: :func:`lift` a ``torch.nn.Module`` (Pyro backend) or an
``equinox.Module`` (NumPyro backend).

Each parameter tensor of the module becomes a sample site named by its parameter path
(``fc.weight``, or ``net.fc.weight`` with ``name="net"``) with the prior given; the module's own
code runs the forward pass with the sampled tensors (``torch.func.functional_call``; equinox's
``partition``/``combine``). The parameters left out of ``bayesian=`` keep the module's values, so
``bayesian="fc.*"`` makes only the last layer Bayesian (a cheap BNN on top of trained features).

A lifted module runs only on its own library's backend: fitting it on another backend raises a
:class:`~ppl_bdl.errors.ModelError` that says which backend it needs and how to write the network
with ``ppl_bdl.dsl.nn`` instead, which runs on every backend.

Example
-------
>>> import numpy as np, torch, ppl_bdl as bdl
>>> from ppl_bdl import dist, nn
>>> torch_net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
>>> lifted = nn.lift(torch_net, prior=dist.Normal(0.0, 1.0), bayesian="2.*", name="net")
>>> @bdl.model
... def classifier(X, y=None):
...     f = lifted.sample()
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=None if y is None else y[idx])
>>> X = np.random.default_rng(0).normal(size=(20, 2)); y = (X[:, 0] > 0).astype(int)
>>> post = bdl.fit(classifier(X, y), backend="pyro", method="vi", num_steps=5, num_samples=4,
...                progress=False)
>>> sorted(post.samples)
['net.2.bias', 'net.2.weight']
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ppl_bdl.backends import available, get
from ppl_bdl.dsl.effects import current_backend
from ppl_bdl.dsl.nn.module import Module, Site, check_layer_prior, check_name, shape_of
from ppl_bdl.dsl.nn.priors import Prior, check_prior, resolve_prior
from ppl_bdl.errors import ModelError

Array = Any


class ModuleParts(NamedTuple):
    """What a backend's ``lift_module(module)`` returns for a module of its library.

    ``kind`` names the module's type for messages (``"torch.nn.Module (Sequential)"``);
    ``params`` maps each parameter path to its array, in the module's order; ``apply(params, x)``
    runs the module on ``x`` with the parameters given by path; ``fans`` maps each path to its
    (fan_in, fan_out), for fan-scaled priors.
    """

    kind: str
    params: dict[str, Array]
    apply: Callable[[Mapping[str, Array], Array], Array]
    fans: dict[str, tuple[int, int]]


Selection = str | Sequence[str] | Callable[[str], bool] | None


class Lifted(Module):
    """A module of torch or equinox with Bayesian parameters; build it with :func:`lift`."""

    has_params = True

    def __init__(
        self,
        module: Any,
        prior: Prior | None = None,
        priors: Mapping[str, Prior] | None = None,
        bayesian: Selection = None,
        name: str | None = None,
    ):
        if isinstance(module, Module) or module is None:
            raise ModelError(
                f"nn.lift expects a torch.nn.Module or an equinox.Module, got {module!r}; a "
                "ppl_bdl.dsl.nn layer is Bayesian already."
            )
        self.module = module
        self.name = None if name is None else check_name(name, "nn.lift")
        self.prior = check_layer_prior(prior, "nn.lift")
        self.overrides = dict(priors or {})
        for pattern, p in self.overrides.items():
            if not isinstance(pattern, str):
                raise ModelError(f"nn.lift: priors keys are name patterns, got {pattern!r}.")
            check_prior(p, f"nn.lift: priors[{pattern!r}]", allow_none=False)
        if not (bayesian is None or isinstance(bayesian, str) or callable(bayesian)):
            bayesian = list(bayesian)
            if not all(isinstance(b, str) for b in bayesian):
                raise ModelError(f"nn.lift: bayesian must hold name patterns, got {bayesian!r}.")
        self.bayesian = bayesian
        self._cache: dict[int, tuple] = {}

    @property
    def path(self) -> str:
        return self.name or ""

    def describe(self, path: str) -> str:
        where = f" {path!r}" if path else ""
        return f"lifted {type(self.module).__name__}{where}"

    def sites(self, backend=None) -> dict[str, tuple[int, ...]]:
        """Site name -> shape on ``backend`` (a backend object; default: the one running)."""
        if backend is None:
            return super().sites()
        with backend.activate():
            return super().sites()

    def priors(self, backend=None) -> dict[str, Any]:
        """Site name -> prior on ``backend`` (a backend object; default: the one running)."""
        if backend is None:
            return super().priors()
        with backend.activate():
            return super().priors()

    # -- lifting, once per backend ---------------------------------------------------------------
    def _lifted(self, backend) -> tuple[ModuleParts, list[str], dict[str, Array]]:
        key = id(backend)
        if key not in self._cache:
            parts = _lift_on(backend, self.module)
            selected = self._select(list(parts.params))
            fixed = {p: backend.asarray(v) for p, v in parts.params.items() if p not in selected}
            self._cache[key] = (backend, (parts, selected, fixed))
        return self._cache[key][1]

    def _select(self, names: list[str]) -> list[str]:
        if self.bayesian is None:
            chosen = list(names)
        elif callable(self.bayesian):
            chosen = [n for n in names if self.bayesian(n)]
        else:
            patterns = [self.bayesian] if isinstance(self.bayesian, str) else self.bayesian
            for pattern in patterns:
                if not fnmatch.filter(names, pattern):
                    raise ModelError(
                        f"nn.lift: the pattern {pattern!r} in bayesian= matches none of the "
                        f"module's parameters {names}."
                    )
            chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not chosen:
            raise ModelError(
                f"nn.lift: bayesian= selects none of the module's parameters {names}; select at "
                "least one (e.g. bayesian='fc.*' for the last layer)."
            )
        for pattern in self.overrides:
            if not fnmatch.filter(chosen, pattern):
                raise ModelError(
                    f"nn.lift: the pattern {pattern!r} in priors= matches none of the Bayesian "
                    f"parameters {chosen}."
                )
        return chosen

    def _prior_of(self, name: str, inherited: Prior | None) -> Prior | None:
        for pattern, prior in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                return prior
        return self._own_prior(inherited)

    # -- Module ----------------------------------------------------------------------------------
    def _sites(self, path, prior):
        parts, selected, _ = self._lifted(current_backend())
        prefix = f"{path}." if path else ""
        sites = []
        for name in selected:
            fans = _fans(parts, name)
            dist = resolve_prior(self._prior_of(name, prior), *fans, self.describe(path))
            sites.append(Site(prefix + name, shape_of(parts.params[name]), dist))
        return sites

    def _forward(self, values, x, path):
        parts, selected, fixed = self._lifted(current_backend())
        prefix = f"{path}." if path else ""
        params = {}
        for name, value in parts.params.items():
            if name in fixed:
                params[name] = fixed[name]
            else:
                params[name] = self._take(values, prefix + name, shape_of(value), path)
        try:
            return parts.apply(params, x)
        except (RuntimeError, TypeError, ValueError) as e:
            raise ModelError(
                f"{self.describe(path)} ({parts.kind}) failed on an input of shape "
                f"{shape_of(x)}: {e}"
            ) from e

    def __repr__(self) -> str:
        return f"<nn.lift of {type(self.module).__name__}>"


def lift(
    module: Any,
    prior: Prior | None = None,
    *,
    priors: Mapping[str, Prior] | None = None,
    bayesian: Selection = None,
    name: str | None = None,
) -> Lifted:
    """Make the parameters of a torch or equinox module sample sites.

    Parameters
    ----------
    module : torch.nn.Module or equinox.Module
        The network. A torch module runs on the Pyro backend (``torch.func.functional_call``); an
        equinox module on the NumPyro backend, mapped over the batch's leading axis
        (``jax.vmap(module)(x)``, equinox's convention of modules that take one example).
    prior : scale, distribution or fan function, optional
        The prior of each Bayesian parameter (default N(0, 1)); see :mod:`ppl_bdl.dsl.nn.priors`.
        Fans follow the ``(out, in, *kernel)`` layout of torch and equinox; a bias takes its weight's.
    priors : dict, optional
        Per-parameter overrides, name pattern -> prior (``{"*.bias": 0.1}``); the first match wins.
    bayesian : pattern, list of patterns or predicate, optional
        The parameters to make Bayesian (default: all); the others keep the module's values.
        Patterns are ``fnmatch`` patterns on the parameter path (``"fc.*"``).
    name : str, optional
        A prefix of the site names (``name.fc.weight``); needed inside a container.

    Returns
    -------
    Lifted
        A layer: ``lifted.sample()`` draws the sites and returns the network as a function of x.

    Example
    -------
    >>> import torch, ppl_bdl as bdl
    >>> from ppl_bdl import nn
    >>> lifted = nn.lift(torch.nn.Linear(3, 2), prior=nn.he_normal(), priors={"bias": 0.1})
    >>> lifted.sites(bdl.backends.get("pyro"))
    {'weight': (2, 3), 'bias': (2,)}
    """
    return Lifted(module, prior, priors=priors, bayesian=bayesian, name=name)


def _fans(parts: ModuleParts, name: str) -> tuple[int, int]:
    head, _, last = name.rpartition(".")
    if last == "bias":
        sibling = f"{head}.weight" if head else "weight"
        if sibling in parts.fans:
            return parts.fans[sibling]
    if name in parts.fans:
        return parts.fans[name]
    n = math.prod(shape_of(parts.params[name]))
    return n, n


def _lift_on(backend, module) -> ModuleParts:
    parts = backend.lift_module(module)
    if parts is not None:
        return parts
    owner, owned = _find_owner(backend, module)
    if owner is not None:
        raise ModelError(
            f"nn.lift: the module is a {owned.kind}, tied to the {owner.name!r} backend, but this "
            f"model runs on the {backend.name!r} backend. Fit it with backend={owner.name!r}, or "
            "write the network with ppl_bdl.dsl.nn (nn.Sequential of nn.Conv2d, nn.Dense, ...; see "
            "docs/nn.md), which runs on every backend."
        )
    raise ModelError(
        f"nn.lift: no installed backend ({', '.join(available())}) can lift a "
        f"{type(module).__module__}.{type(module).__name__}. Lift a torch.nn.Module (Pyro "
        "backend) or an equinox.Module (NumPyro backend), or write the network with ppl_bdl.dsl.nn."
    )


def _find_owner(backend, module) -> tuple[Any, ModuleParts | None]:
    for name in available():
        other = get(name, backend.precision)
        if type(other) is type(backend):
            continue
        parts = other.lift_module(module)
        if parts is not None:
            return other, parts
    return None, None
