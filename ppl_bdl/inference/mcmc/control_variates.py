"""SVRG control variates for the SG-MCMC gradient (Dubey et al. 2016, "Variance reduction in
stochastic gradient Langevin dynamics", NeurIPS; their SVRG-LD, Algorithm 2).

Every ``period`` steps (by default one epoch, ⌈N / n⌉ steps) the chain stores an anchor θ̃ (its
position then) and the full-data gradient ∇U(θ̃). Between refreshes each step's gradient is

    ĝ(θ) = ∇U(θ̃) + ∇Ũ_B(θ) − ∇Ũ_B(θ̃),

with Ũ_B the minibatch potential of Eq. 2.8 of "Bayesian Computation in Deep Learning" (prior + N/n × the minibatch's
log-likelihood) on the step's minibatch B. It is unbiased for ∇U(θ), and its variance shrinks
with ‖θ − θ̃‖: near the anchor the minibatch noise cancels. The cost is a second minibatch
gradient per step and one full-data gradient per period (one more pass over the data per epoch).

The estimator is written once, around any registered kernel: the kernel is built with
:func:`svrg_gradient` as its ``value_and_grad`` and sees, as its "minibatch", an
:class:`AnchoredBatch` (the step's :class:`~ppl_bdl.backend_protocol.Batch` with the anchor),
which it passes on unread, as every kernel does. :func:`svrg_transition` holds the anchor in the
chain's state and refreshes it inside the compiled step with :meth:`Backend.cond` on the step's
number (the same for every chain, so under ``vmap`` only the refresh steps pay the full pass).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def mean_model(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> y = np.random.default_rng(0).normal(size=100)
>>> post = bdl.fit(mean_model(y), backend="numpyro", method="sgld", step_size=1e-3,
...                batch_size=10, control_variate="svrg", num_warmup=100, num_samples=200,
...                num_chains=2, progress=False)
>>> post.settings["anchor_period"]
10
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc import blocks as bt

#: The control variates of the SG-MCMC gradient (``fit(..., control_variate=...)``).
CONTROL_VARIATES = ("svrg",)


class AnchoredBatch(NamedTuple):
    """What a kernel's gradient sees under SVRG: the step's batch, the anchor θ̃ and ∇U(θ̃)."""

    batch: Batch
    anchor: Any
    anchor_grad: Any


def check_control_variate(control_variate: Any, anchor_period: Any) -> None:
    """Raise :class:`~ppl_bdl.errors.ConfigError` for an unknown ``control_variate`` or a bad
    ``anchor_period`` (an int >= 1, or None: one epoch)."""
    if control_variate is not None and control_variate not in CONTROL_VARIATES:
        raise ConfigError(
            f"unknown control_variate {control_variate!r}; expected one of "
            f"{', '.join(map(repr, CONTROL_VARIATES))}, or None (the plain minibatch gradient)."
        )
    if anchor_period is None:
        return
    if control_variate is None:
        raise ConfigError(
            f"anchor_period={anchor_period!r} applies to control_variate='svrg' only; pass "
            "control_variate='svrg', or leave anchor_period out."
        )
    if isinstance(anchor_period, bool) or not isinstance(anchor_period, int) or anchor_period < 1:
        raise ConfigError(
            f"anchor_period must be an int >= 1 (steps between full-data gradients; None: one "
            f"epoch), got {anchor_period!r}."
        )


def anchor_period(period: int | None, plate: tuple[str, int] | None, batch_size: int | None):
    """The steps between anchor refreshes: ``period``, or one epoch (⌈N / n⌉ steps). Raises
    :class:`~ppl_bdl.errors.ConfigError` without minibatches (a full-batch gradient has no
    minibatch noise to cancel)."""
    if plate is None:
        raise ConfigError(
            "control_variate='svrg' reduces the noise of minibatch gradients, but this fit uses "
            "the full data every step (no batch_size, or batch_size >= the plate's size). Pass "
            "batch_size=n smaller than the data, or leave control_variate out."
        )
    return period if period is not None else -(-plate[1] // batch_size)


def svrg_gradient(value_and_grad):
    """The SVRG estimate as a kernel's ``value_and_grad(position, anchored) -> (Ũ_B(θ), ĝ)``,
    ``anchored`` an :class:`AnchoredBatch` (the potential is the minibatch's, as without); the
    position an array or a tuple of blocks (:mod:`ppl_bdl.inference.mcmc.blocks`)."""

    def estimate(position, anchored: AnchoredBatch):
        batch = Batch(anchored.batch.data, anchored.batch.indices)
        potential, grad = value_and_grad(position, batch)
        _, grad_at_anchor = value_and_grad(anchored.anchor, batch)
        return potential, bt.tree_map(
            lambda g, ga, a: g - ga + a, grad, grad_at_anchor, anchored.anchor_grad
        )

    return estimate


def svrg_transition(backend, kernel, full_value_and_grad, period: int) -> Transition:
    """The transition of ``kernel`` (built with :func:`svrg_gradient`) with the anchor in its
    state: ``{"kernel": ..., "anchor": θ̃, "anchor_grad": ∇U(θ̃), "count": steps taken}``.
    ``full_value_and_grad(position, batch)`` is the full-data potential and gradient. The
    anchor is refreshed before step t when t % ``period`` == 0 (t: the run's step number; the
    chain's own count where a caller gives none)."""

    def init(key, position, data):
        _, grad = full_value_and_grad(position, Batch(data, None))
        count = backend.asarray(0, dtype="int")
        return {
            "kernel": kernel.init(position),
            "anchor": position,
            "anchor_grad": grad,
            "count": count,
        }

    def step(key, state, batch, rate):
        t = state["count"] if batch.step is None else batch.step

        def refresh(state):
            position = state["kernel"]["position"]
            _, grad = full_value_and_grad(position, Batch(batch.data, None))
            return position, grad

        def keep(state):
            return state["anchor"], state["anchor_grad"]

        anchor, anchor_grad = backend.cond(t % period == 0, refresh, keep, state)
        inner, info = kernel.step(
            key, state["kernel"], AnchoredBatch(batch, anchor, anchor_grad), rate
        )
        new = {
            "kernel": inner,
            "anchor": anchor,
            "anchor_grad": anchor_grad,
            "count": state["count"] + 1,
        }
        return new, info

    return Transition(init, step, lambda state: state["kernel"]["position"])
