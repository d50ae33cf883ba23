"""Pyro's NUTS stepped by the core's driver, and our SG-MCMC kernels as Pyro MCMC kernels.

:func:`native_transition` runs Pyro's own NUTS kernel (its warmup adaptation included) one
draw per step of the core's driver, so NUTS gets the same chunks, progress, Ctrl-C and checks as
every other method. The potential and its gradient are traced once to one TorchScript graph
(Pyro's own ``jit_compile`` only applies to models, not to a potential function): each leapfrog
step then costs a graph call instead of a walk through the model in Python and autograd's. Pyro's kernels draw from
torch's global generator; each chain carries that generator's state in its own state, so a chain's
draws depend only on its seed. A chain's state is Pyro's kernel object, which a step changes in
place: after a failed step the loop keeps the draws before it, not that state (MCMC needs only
the draws).

:class:`PyroSGMCMC` is the other direction: a registered SG-MCMC transition of the core as a
``pyro.infer.mcmc.MCMCKernel``, so ``pyro.infer.MCMC`` drives it.
"""

from __future__ import annotations

import warnings

import torch
from pyro.infer.mcmc import NUTS
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ppl_bdl.backend_protocol import NativeSettings, Transition
from ppl_bdl.dsl.effects import use_backend


class _ChainState:
    """One chain of a Pyro kernel: the kernel (it keeps its adaptation state), the current
    parameters, torch's generator state for this chain, and counters for the draw's stats."""

    def __init__(self, kernel, params, rng_state, counter):
        self.kernel, self.params, self.rng_state, self.counter = kernel, params, rng_state, counter
        self.previous_mean_accept = 0.0
        self.divergences = 0


def native_transition(backend, potential, settings: NativeSettings) -> Transition:
    """Pyro's NUTS on ``potential(flat, data)`` as ``(init, step, emit)``."""

    def init(key, position, data):
        counter = {"calls": 0}
        energy = _traced_energy(backend, potential, data, position.detach())

        def potential_fn(params):
            counter["calls"] += 1
            with use_backend(backend):
                return energy(params["theta"])

        common = dict(
            potential_fn=potential_fn,
            target_accept_prob=settings.target_accept,
            full_mass=settings.dense_mass,
            adapt_step_size=settings.num_warmup > 0,
            adapt_mass_matrix=settings.num_warmup > 0,
        )
        if settings.step_size is not None:
            common["step_size"] = settings.step_size
        kernel = NUTS(max_tree_depth=settings.max_tree_depth, **common)
        kernel.initial_params = {"theta": position}
        seed = int(torch.randint(0, 2**62, (1,), generator=key, device=key.device))
        with torch.random.fork_rng(devices=_cuda(position)):
            torch.manual_seed(seed)
            with backend.scope():
                kernel.setup(settings.num_warmup)
            rng_state = _get_rng(position)
        return _ChainState(kernel, {"theta": position}, rng_state, counter)

    def step(key, state: _ChainState, batch, rate):
        kernel = state.kernel
        calls_before = state.counter["calls"]
        with torch.random.fork_rng(devices=_cuda(state.params["theta"])):
            _set_rng(state.params["theta"], state.rng_state)
            with torch.enable_grad(), backend.scope():
                state.params = kernel.sample(state.params)
            state.rng_state = _get_rng(state.params["theta"])
        return state, _stats(state, kernel, state.counter["calls"] - calls_before, settings)

    return Transition(init, step, lambda state: state.params["theta"])


def _traced_energy(backend, potential, data, position):
    """``potential(z, data)`` as Pyro's NUTS calls it: a function of ``z`` whose ``grad`` Pyro's
    leapfrog takes. Where it traces, U and ∇U come from one traced graph of
    ``torch.func.grad_and_value`` and autograd only hands back the ∇U it computed
    (:class:`_EnergyWithGradient`): on the posteriordb models this halves the cost of a
    gradient against autograd walking the traced potential's graph. Otherwise (or in a
    data-parallel fit, which traces at its first call) the traced potential, autograd through it."""

    def value_and_grad(z):
        grad, value = torch.func.grad_and_value(lambda x: potential(x, data))(z)
        return value, grad

    with backend.scope():
        if backend.parallel is None:
            # Where it does not trace (it returns the eager function, with a warning), the
            # traced potential below is the faster fallback, and that warning would mislead.
            with warnings.catch_warnings(record=True):
                fused = backend.trace(value_and_grad, (position,))
            if fused is not value_and_grad:
                return lambda z: _EnergyWithGradient.apply(z, fused)
        return backend.trace(lambda z: potential(z, data), (position,))


class _EnergyWithGradient(torch.autograd.Function):
    """U(z) from ``fused(z) = (U, ∇U)``, whose backward returns the ∇U already computed."""

    @staticmethod
    def forward(ctx, z, fused):
        value, grad = fused(z)
        ctx.save_for_backward(grad)
        return value

    @staticmethod
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        return upstream * grad, None


def _stats(state: _ChainState, kernel, calls: int, settings: NativeSettings) -> dict:
    """The draw's statistics, read off the kernel (Pyro keeps no per-draw statistics)."""
    t = kernel._t  # draws made so far, warmup included
    n = t - settings.num_warmup if t > settings.num_warmup else t
    mean_accept = float(kernel._mean_accept_prob)
    if t == settings.num_warmup + 1:  # Pyro restarts the running mean after warmup
        state.previous_mean_accept = 0.0
    accept = n * mean_accept - (n - 1) * state.previous_mean_accept
    state.previous_mean_accept = mean_accept
    divergences = len(kernel._divergences)
    diverging = divergences > state.divergences
    state.divergences = divergences
    return {
        "diverging": torch.tensor(diverging),
        "n_steps": torch.tensor(calls),
        "acceptance_rate": torch.tensor(min(max(accept, 0.0), 1.0)),
        "step_size": torch.tensor(float(kernel.step_size)),
        "lp": torch.tensor(-float(kernel._potential_energy_last)),
    }


def _cuda(tensor) -> list[int]:
    return [tensor.device.index or 0] if tensor.device.type == "cuda" else []


def _get_rng(tensor):
    if tensor.device.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(tensor.device)
    return torch.get_rng_state(), None


def _set_rng(tensor, state) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], tensor.device)


class PyroSGMCMC(MCMCKernel):
    """A registered SG-MCMC kernel of ppl_bdl as a Pyro MCMC kernel.

    Parameters are the model's latent sites in the unconstrained space; ``transforms`` maps them
    back, so ``pyro.infer.MCMC(...).get_samples()`` returns constrained values.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from pyro.infer import MCMC
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> kernel = bdl.native_kernel(mean_model(np.zeros(50)), "pyro", "sgld",
    ...                                    step_size=1e-3, batch_size=10)
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=20, disable_progbar=True)
    >>> mcmc.run()
    >>> mcmc.get_samples()["mu"].shape
    torch.Size([20])
    """

    def __init__(self, spec):
        self.spec = spec
        self.backend = spec.setup.backend
        self._initial_params = None
        self.transforms = None
        self._info: dict = {}

    def setup(self, warmup_steps, *args, **kwargs):
        spec, backend = self.spec, self.backend
        layout = spec.setup.layout
        self._key = backend.random.key(spec.seed)
        self._batches = spec.minibatches()
        self._step = 0
        self.transforms = {}
        for name in layout.names:
            transform = backend.biject_to(layout.sites[name].native.support)
            if transform is not None:
                self.transforms[name] = transform.inv
        with backend.scope(), use_backend(backend):
            if self._initial_params is None:
                self._initial_params = layout.unflatten(backend.asarray(spec.initial_position()))
            flat = torch.cat([self._initial_params[n].reshape(-1) for n in layout.names])
            self._state = spec.transition.init(self._key, flat, spec.data)

    @property
    def initial_params(self):
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params):
        self._initial_params = params

    def sample(self, params):
        spec, backend = self.spec, self.backend
        with backend.scope(), use_backend(backend), torch.no_grad():
            idx = backend.asarray(self._batches.next_block(1)[0]) if self._batches else None
            rate = spec.rate(backend.asarray(self._step, dtype="int"))
            state, self._info = spec.transition.step(self._key, self._state, spec.batch(idx), rate)
            spec.check(self._info, self._step)
            self._state = state
            self._step += 1
            return spec.setup.layout.unflatten(spec.transition.emit(state))

    def logging(self):
        return {k: f"{float(v):.3g}" for k, v in self._info.items()}

    def diagnostics(self):
        return {}
