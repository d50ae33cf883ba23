"""Reparameterisation: rewrite latent sites of a model without touching its code.

``bdl.reparam(model, {site: strategy})`` returns a model that runs the original function under a
:class:`ReparamHandler` on the effect stack. When a configured latent ``sample`` site passes
through it, the strategy samples new latent site(s) in its place and turns the original site
into a deterministic function of them: the site keeps its name and shape in the posterior,
predictions and ArviZ (as a deterministic), while the sampler or guide works on the new,
better-conditioned latents.

:class:`LocScale` is the partial non-centring of Papaspiliopoulos, Roberts and Sköld (2007) and
Gorinova, Moore and Hoffman (2020), as NumPyro's ``LocScaleReparam``: a site
``x ~ F(loc, scale)`` of a location-scale family becomes::

    x_decentered ~ F(c·loc, scale^c)
    x = loc + scale^(1-c) · (x_decentered - c·loc)       (a deterministic)

so ``c = 0`` is the fully non-centred form (``x_decentered`` is standard), ``c = 1`` the model as
written, and ``centered=None`` a learnable ``c`` in [0, 1] (a ``bdl.param`` named
``{site}_centered``: optimised by VI; MCMC holds it at 0.5 with ``hold_params=True``). Both
strategies see through ``.expand(...)``, ``.to_event(...)`` and ``.mask(...)``: the new latent
site is wrapped (and masked) as the original was.

:class:`TransformReparam` is NumPyro's ``TransformReparam``: a site ``x ~
TransformedDistribution(base, transforms)`` becomes ``x_base ~ base`` and ``x = transforms(x_base)``
(a deterministic).

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def funnel():
...     log_scale = bdl.sample("log_scale", dist.Normal(0.0, 3.0))
...     bdl.sample("x", dist.Normal(0.0, bdl.math.exp(log_scale / 2)), shape=(4,))
>>> nc = bdl.reparam(funnel, {"x": bdl.LocScale(0)})
>>> nc
<ppl_bdl.Model funnel>
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.dsl.dist.base import (
    Distribution,
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
)
from ppl_bdl.dsl.dist.continuous import Cauchy, Laplace, Logistic, Normal, StudentT
from ppl_bdl.dsl.dist.transformed import TransformedDistribution
from ppl_bdl.dsl.effects import Handler, Message, current_backend, current_runtime
from ppl_bdl.dsl.model import BoundModel, Model
from ppl_bdl.dsl.primitives import param, sample
from ppl_bdl.errors import ConfigError, ModelError

#: The location-scale families: x = loc + scale·ε with ε's law free of loc and scale (LogNormal
#: and TruncatedNormal have loc/scale parameters but are not of this form).
LOC_SCALE_FAMILIES: tuple[type[Distribution], ...] = (Normal, StudentT, Cauchy, Laplace, Logistic)


class Reparam:
    """Base of the reparameterisation strategies :func:`reparam` accepts.

    A strategy's :meth:`apply` gets a latent ``sample`` message on its way down the effect stack;
    it samples the new latent site(s) with :func:`~ppl_bdl.dsl.primitives.sample` (they pass
    through the whole stack, plates included) and turns ``msg`` into a ``deterministic`` message
    holding the site's value.
    """

    def apply(self, msg: Message) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class LocScale(Reparam):
    """Partial non-centring of a location-scale site (see the module docstring for the map).

    Parameters
    ----------
    centered : float in [0, 1] or None
        0 (default): fully non-centred, the new site ``{name}_decentered`` is standard (a funnel's
        neck becomes flat); 1: the site as written; in between: partly centred. None learns it:
        a ``bdl.param`` ``{name}_centered`` in [0, 1], one per element of the site's event,
        optimised by VI (Gorinova et al., 2020); MCMC needs ``hold_params=True``, which
        holds it at 0.5.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def hier():
    ...     tau = bdl.sample("tau", dist.HalfNormal(1.0))
    ...     with bdl.plate("group", 3):
    ...         bdl.sample("theta", dist.StudentT(4.0, 0.0, tau))
    >>> learned = bdl.reparam(hier, {"theta": bdl.LocScale(centered=None)})
    >>> learned.fn.config
    {'theta': LocScale(centered=None)}
    """

    centered: float | None = 0.0

    def __post_init__(self):
        c = self.centered
        if c is None:
            return
        if isinstance(c, bool) or not isinstance(c, int | float | np.number) or not 0 <= c <= 1:
            raise ConfigError(
                f"LocScale(centered={c!r}): centered must be a number in [0, 1] (0: non-centred, "
                "1: centred) or None to learn it with VI."
            )

    def apply(self, msg: Message) -> None:
        fn, rewrap = _unwrap_reshaped(msg.fn)
        if type(fn) not in LOC_SCALE_FAMILIES:  # exact: the constructor is rebuilt below
            families = ", ".join(f.__name__ for f in LOC_SCALE_FAMILIES)
            raise ModelError(
                f"bdl.LocScale on site {msg.name!r}: its distribution {msg.fn!r} is not a "
                f"location-scale family ({families}). Reparameterise a site of one of these, or "
                "write the transform in the model (e.g. sample z ~ Normal(0, 1) and set "
                "bdl.deterministic(name, exp(loc + scale * z)) for a LogNormal)."
            )
        c = self.centered
        if c is not None and c == 1:
            return  # centred: the site as written
        loc, scale = fn.params["loc"], fn.params["scale"]
        if c is None:
            c = param(f"{msg.name}_centered", np.full(_event_shape(msg), 0.5), "unit_interval")
        decentered_fn = rewrap(type(fn)(**{**fn.params, "loc": c * loc, "scale": scale**c}))
        x = sample(f"{msg.name}_decentered", decentered_fn, shape=msg.shape)
        value = loc + scale * x if _is_zero(c) else loc + scale ** (1 - c) * (x - c * loc)
        _become_deterministic(msg, value)


@dataclass(frozen=True)
class TransformReparam(Reparam):
    """Sample a transformed site's base draw and push it through the transforms.

    For a latent site ``x ~ TransformedDistribution(base, [t_1, ..., t_k])`` (possibly under
    ``.expand(...)`` and ``.to_event(...)``), as NumPyro's ``TransformReparam``::

        x_base ~ base                         (expanded to the site's shape)
        x = t_k(... t_1(x_base))               (a deterministic)

    The sampler or guide then works on the base's coordinates (for an ``AffineTransform(loc,
    scale)`` of a standard normal, the non-centred form), and ``x`` keeps its name and shape.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> T = dist.transforms
    >>> @bdl.model
    ... def positive():
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    ...     with bdl.plate("group", 3):
    ...         bdl.sample(
    ...             "x", dist.TransformedDistribution(dist.Normal(0.0, 1.0), [
    ...                 T.AffineTransform(mu, 0.5), T.ExpTransform()])
    ...         )
    >>> model = bdl.reparam(positive, {"x": bdl.TransformReparam()})
    >>> prior = bdl.prior_predictive(model(), num_samples=4, backend="numpyro")
    >>> prior.draws["x"].shape, prior.draws["x_base"].shape
    ((4, 3), (4, 3))
    """

    def apply(self, msg: Message) -> None:
        fn, _ = _unwrap_reshaped(msg.fn)
        if not isinstance(fn, TransformedDistribution):
            raise ModelError(
                f"bdl.TransformReparam on site {msg.name!r}: its distribution {msg.fn!r} is not a "
                "dist.TransformedDistribution. Write the site as "
                "dist.TransformedDistribution(base, transforms) (e.g. a LogNormal as "
                "TransformedDistribution(Normal(loc, scale), dist.transforms.ExpTransform())), or "
                "use bdl.LocScale for a location-scale family."
            )
        x = sample(f"{msg.name}_base", _base_of_site(msg.fn, fn), shape=msg.shape)
        backend = current_backend()
        for transform in fn.transforms:
            x = backend.transform(transform)(x)
        _become_deterministic(msg, x)


def _unwrap_reshaped(fn: Distribution):
    """The distribution under ``fn``'s ``.expand``/``.to_event``/``.mask`` wrappers, and a
    function that puts the same wrappers, in the same order, around another distribution."""
    fn, layers = _wrappers(fn)

    def rewrap(inner: Distribution) -> Distribution:
        for layer in reversed(layers):
            if isinstance(layer, ExpandedDistribution):
                inner = inner.expand(layer.batch_shape)
            elif isinstance(layer, MaskedDistribution):
                inner = inner.mask(layer.params["mask"])
            else:
                inner = inner.to_event(layer.params["reinterpreted_batch_ndims"])
        return inner

    return fn, rewrap


def _wrappers(fn: Distribution) -> tuple[Distribution, list[Distribution]]:
    """The distribution under ``fn``'s ``.expand``/``.to_event``/``.mask`` wrappers, and the
    wrappers, outermost first."""
    layers = []
    while isinstance(fn, ExpandedDistribution | Independent | MaskedDistribution):
        layers.append(fn)
        fn = fn.base_dist
    return fn, layers


def _masks_of(site_fn: Distribution) -> list[tuple[Any, tuple[int, ...]]]:
    """Each ``.mask`` wrapper of ``site_fn``: its mask and the batch shape it masks."""
    _, layers = _wrappers(site_fn)
    return [(m.params["mask"], m.batch_shape) for m in layers if isinstance(m, MaskedDistribution)]


def _aligned_mask(mask: Any, masked_shape: tuple[int, ...], batch_shape: tuple[int, ...]):
    """``mask`` (of a layer whose batch shape was ``masked_shape``, a prefix of ``batch_shape``:
    the dims right of it became events there) reshaped to broadcast against ``batch_shape``."""
    shape = tuple(getattr(mask, "shape", ()))
    if not shape:
        return mask
    lead = (1,) * (len(masked_shape) - len(shape))
    return mask.reshape(lead + shape + (1,) * (len(batch_shape) - len(masked_shape)))


def _base_of_site(site_fn: Distribution, transformed: TransformedDistribution) -> Distribution:
    """The base of ``transformed`` shaped for the site of ``site_fn`` (``transformed`` under its
    reshaping wrappers): the site's batch shape, and as events the site's event dims that are
    not the transformed distribution's own plus the base dims its transforms consume (a
    stick-breaking transform's K - 1 inputs); masked where the site is."""
    base = transformed.base_dist
    own_batch, own_event = transformed.batch_shape, transformed.event_shape
    # The base dims that the transforms take as their event: to the right of the batch dims.
    consumed = base.batch_shape[len(own_batch) :]
    moved = site_fn.event_shape[: len(site_fn.event_shape) - len(own_event)]  # by .to_event
    batch_shape = site_fn.batch_shape + moved + consumed
    if batch_shape != base.batch_shape:
        base = base.expand(batch_shape)
    for mask, masked_shape in _masks_of(site_fn):
        base = base.mask(_aligned_mask(mask, masked_shape, batch_shape))
    return base.to_event(len(moved) + len(consumed))


def _is_zero(c: Any) -> bool:
    return isinstance(c, int | float | np.number) and c == 0


def _event_shape(msg: Message) -> tuple[int, ...]:
    """The shape of one draw of the site per plate element (its shape= or, outside plates, the
    distribution's batch shape)."""
    if msg.shape is not None:
        return tuple(msg.shape)
    return () if msg.plates else tuple(msg.fn.batch_shape)


def _become_deterministic(msg: Message, value: Any) -> None:
    msg.type, msg.fn, msg.value = "deterministic", None, value


class ReparamHandler(Handler):
    """Applies ``config`` (site name -> :class:`Reparam`) to the latent sample sites it sees, and
    remembers the latent sites it saw to name them when a configured site never came."""

    def __init__(self, config: dict[str, Reparam]):
        self.config = config
        self.latent_sites: list[str] = []
        self.applied: set[str] = set()

    def process(self, msg: Message) -> None:
        if msg.type != "sample":
            return
        if msg.obs is None:
            self.latent_sites.append(msg.name)
        strategy = self.config.get(msg.name)
        if strategy is None:
            return
        if msg.obs is not None:
            raise ModelError(
                f"bdl.reparam: site {msg.name!r} is observed (it has obs=); only latent sites can "
                f"be reparameterised. Remove {msg.name!r} from the reparam config."
            )
        self.applied.add(msg.name)
        strategy.apply(msg)
        # The new sites ran inside this one: it is again the site in progress (an error in the
        # model's next line then names this site as the last one computed).
        current_runtime().current_site = msg.name

    def check_all_applied(self, model_name: str) -> None:
        """Raise when a configured site was not among the model's latent sample sites."""
        missing = [name for name in self.config if name not in self.applied]
        if not missing:
            return
        name = missing[0]
        close = difflib.get_close_matches(name, self.latent_sites, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ModelError(
            f"bdl.reparam: model {model_name!r} has no latent sample site {name!r}; its latent "
            f"sites are {self.latent_sites}.{hint} Name latent sites in the reparam config."
        )


class _ReparameterisedFunction:
    """The function of a reparameterised model: the original model's, run under a
    :class:`ReparamHandler` (a class rather than a closure so the model pickles)."""

    # No instance dict: ``Model`` copies a function's ``__dict__`` onto itself.
    __slots__ = ("model", "config")

    def __init__(self, model: Model, config: dict[str, Reparam]):
        self.model = model
        self.config = config

    @property
    def __name__(self) -> str:  # read by Model as a function's name
        return self.model.name

    @property
    def __code__(self) -> Any:
        """The model function's code: an error raised in the model points at the model's line."""
        return getattr(self.model.fn, "__code__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handler = ReparamHandler(self.config)
        with handler:
            out = self.model.fn(*args, **kwargs)
        handler.check_all_applied(self.model.name)
        return out


def reparam(model: Model | BoundModel, config: dict[str, Reparam]) -> Model | BoundModel:
    """The model with the latent sites named in ``config`` reparameterised.

    Parameters
    ----------
    model : Model or BoundModel
        A ``@bdl.model`` (or one with its data bound: the result is bound to the same data).
    config : dict
        Latent site name -> strategy (:class:`LocScale`, :class:`TransformReparam`). Each named
        site keeps its name and shape as a deterministic; the strategy's new latent sites
        (``{name}_decentered``, ``{name}_base``) are what the method samples.

    Returns
    -------
    Model or BoundModel
        A model that fits with every method on every backend, predicts and draws from its prior
        like the original.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl.models import posteriordb as pdb
    >>> nc = bdl.reparam(pdb.eight_schools_centered, {"theta": bdl.LocScale(0)})
    >>> prior = bdl.prior_predictive(nc(**pdb.eight_schools_data()), num_samples=5,
    ...                              backend="numpyro")
    >>> prior.draws["theta"].shape, prior.draws["theta_decentered"].shape
    ((5, 8), (5, 8))
    """
    if isinstance(model, BoundModel):
        return BoundModel(reparam(model.model, config), model.args, model.kwargs)
    if not isinstance(model, Model):
        raise ConfigError(
            f"bdl.reparam: expected a @bdl.model (or one bound to data), got "
            f"{type(model).__name__}. Decorate the model function with @bdl.model."
        )
    if not isinstance(config, dict) or not config:
        raise ConfigError(
            f"bdl.reparam: config must be a non-empty dict of site name -> strategy, e.g. "
            f"{{'theta': bdl.LocScale(0)}}; got {config!r}."
        )
    for name, strategy in config.items():
        if not isinstance(name, str) or not isinstance(strategy, Reparam):
            raise ConfigError(
                f"bdl.reparam: config entry {name!r}: {strategy!r} should map a site name (str) to "
                "a strategy such as bdl.LocScale(0)."
            )
    return Model(_ReparameterisedFunction(model, dict(config)))
