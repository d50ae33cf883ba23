"""Custom guides written in the DSL: ``@bdl.guide``.

A guide function calls ``bdl.param`` for its variational parameters and ``bdl.sample`` once for
every latent site of the model, with the same names. It is lowered like a model, so the lowered
guide is a plain Pyro/NumPyro guide their own SVI accepts; ``fit(method="vi", guide=my_guide)``
fits it with the core's objectives. The guide receives the model's data arguments.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> @bdl.guide
... def q(y):
...     loc = bdl.param("mu_loc", 0.0)
...     scale = bdl.param("mu_scale", 1.0, constraint="positive")
...     bdl.sample("mu", dist.Normal(loc, scale))
>>> post = bdl.fit(m(np.array([1.0, 2.0])), backend="numpyro", method="vi", guide=q,
...                num_steps=300, lr=0.05, num_samples=50, progress=False)
>>> sorted(post.guide.params)
['mu_loc', 'mu_scale']
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ppl_bdl.dsl.dist.constraints import param_to_constrained, param_to_unconstrained
from ppl_bdl.dsl.model import BoundModel, Model
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.vi.guides.base import Guide, GuideInit, ParamLayout
from ppl_bdl.trace.interpreter import Evaluator
from ppl_bdl.trace.model_trace import trace_model


class GuideFunction(Model):
    """A DSL guide. Call it with the model's data to bind it (``fit`` does that for you)."""

    def __repr__(self) -> str:
        return f"<ppl_bdl.guide {self.name}>"


def guide(fn: Callable) -> GuideFunction:
    """Decorator: a DSL function with ``param`` and ``sample`` sites becomes a variational guide.

    See the module docstring for an example.
    """
    return GuideFunction(fn)


class _GuideRunner(Evaluator):
    """Evaluate a guide: latent sites get reparameterised draws, log q accumulates."""

    def _draw(self, msg, native, shape, observed_site):
        backend = self.backend
        self.key, sub = backend.random.split(self.key)
        full = backend.expand(native, shape.batch + shape.extra, 0)
        return backend.random.draw(sub, full, reparameterized=True)


class CustomGuide(Guide):
    """A DSL guide as a :class:`Guide` over the flat unconstrained latent vector.

    Its draws are mapped to the unconstrained space through each model site's bijection, and
    log q picks up the log-Jacobian, so the objectives treat it like the built-in guides.
    """

    name = "custom"
    #: Its draws come from its own sample sites (with a key), not a transform of noise.
    path_gradient = False

    def __init__(self, layout, backend, init: GuideInit, bound_guide: BoundModel, seed: int = 0):
        super().__init__(layout, backend, init, seed)
        self.bound_guide = bound_guide
        self.name = bound_guide.name
        sites = trace_model(bound_guide, backend, seed=seed, missing="prior")
        latent = {n for n, s in sites.items() if s.kind == "latent"}
        observed = [n for n, s in sites.items() if s.kind == "observed"]
        wanted = set(layout.names)
        if latent != wanted or observed:
            raise ModelError(
                f"guide {self.name!r} must have one sample site per latent site of the model, with "
                f"the same names. Guide sample sites: {sorted(latent)}; model latent sites: "
                f"{sorted(wanted)}; missing in the guide: {sorted(wanted - latent)}; not in the "
                f"model: {sorted((latent - wanted) | set(observed))}."
            )
        self._params = {n: s for n, s in sites.items() if s.kind == "param"}
        self.param_layout = ParamLayout(
            {n: tuple(np.shape(backend.to_numpy(s.value))) for n, s in self._params.items()}
        )
        self._transforms = {
            slot.name: backend.biject_to(layout.sites[slot.name].native.support)
            for slot in layout.slots
        }

    def initial_params(self) -> dict[str, np.ndarray]:
        out = {}
        for name, site in self._params.items():
            value = np.asarray(self.backend.to_numpy(site.value), dtype=float)
            out[name] = param_to_unconstrained(site.constraint, value)
        return out

    def constrained(self, params: dict) -> dict:
        return {
            name: param_to_constrained(self._params[name].constraint, value, self.m)
            for name, value in params.items()
        }

    def describe(self, params):
        with self.backend.activate():
            cons = self.constrained({k: self.backend.asarray(v) for k, v in params.items()})
            return {k: np.asarray(self.backend.to_numpy(v)) for k, v in cons.items()}

    def _run(self, params, key=None, values=None, record=False):
        args, kwargs = self.bound_guide.data_for(self.backend)
        runner = _GuideRunner(
            self.backend,
            params=self.constrained(params),
            key=key,
            values=values,
            missing="prior",
            record=record,
        )
        with runner:
            self.bound_guide.model.fn(*args, **kwargs)
        return runner

    def _one_draw(self, params, key):
        m = self.m
        runner = self._run(params, key=key, record=True)
        values = {n: s.value for n, s in runner.sites.items() if s.kind == "latent"}
        log_q = runner.log_joint
        parts = []
        for slot in self.layout.slots:
            x = values[slot.name]
            transform = self._transforms[slot.name]
            u = x if transform is None else transform.inv(x)
            if transform is not None:
                log_q = log_q + m.sum(transform.log_abs_det_jacobian(u, x))
            parts.append(m.reshape(u, (-1,)))
        return m.concatenate(parts), log_q

    def noise_shape(self, num: int) -> None:
        return None  # it draws through its own sample sites, with the key

    def sample(self, params, key, num: int, mask=None):
        keys = self.backend.random.keys(key, num)
        return self.backend.vmap(lambda k: self._one_draw(params, k))(keys)

    def log_prob(self, params, theta):
        m = self.m

        def one(row):
            parts = self.layout.unflatten(row)
            values, log_det = {}, 0.0
            for slot in self.layout.slots:
                u = parts[slot.name]
                transform = self._transforms[slot.name]
                x = u if transform is None else transform(u)
                if transform is not None:
                    log_det = log_det + m.sum(transform.log_abs_det_jacobian(u, x))
                values[slot.name] = x
            return self._run(params, values=values).log_joint + log_det

        return self.backend.vmap(one)(theta)


def bind_guide(obj, bound_model: BoundModel) -> BoundModel | None:
    """A bound DSL guide from ``guide=`` (a :class:`GuideFunction` gets the model's data)."""
    if isinstance(obj, GuideFunction):
        return obj(*bound_model.args, **bound_model.kwargs)
    if isinstance(obj, BoundModel) and isinstance(obj.model, GuideFunction):
        return obj
    if isinstance(obj, Model):
        raise ConfigError(
            f"guide={obj.name!r} is a @bdl.model; decorate guide functions with @bdl.guide."
        )
    return None
