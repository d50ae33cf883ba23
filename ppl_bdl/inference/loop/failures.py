"""A run that stopped early (a non-finite step, Ctrl-C) raises an error carrying what it had."""

from __future__ import annotations

from ppl_bdl.errors import InferenceError, RunInterrupted
from ppl_bdl.inference.loop.driver import RunResult
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup


def partial_posterior(setup: Setup, run: RunResult, method: str, log_likelihood: bool = True):
    """A :class:`Posterior` of the draws kept before the run stopped, or None if there are none."""
    if run.draws is None or run.draws.shape[1] == 0:
        return None
    return build_posterior(setup, run.draws, run.infos, method, log_likelihood=log_likelihood)


def raise_failure(
    setup: Setup,
    run: RunResult,
    kind: str,
    requested: int,
    method: str | None = None,
    step_size: float | None = None,
    log_likelihood: bool = True,
):
    """Raise the :class:`InferenceError` of ``run.failure`` with the partial posterior attached.

    ``kind`` names the method in the message (e.g. "SG-MCMC kernel 'sgld'", "NUTS")."""
    failure = run.failure
    method = method or setup.settings.get("method", "")
    partial = partial_posterior(setup, run, method, log_likelihood)
    kept = (
        "No draws were kept yet"
        if partial is None
        else f"The {partial.num_draws} draws per chain kept before it ({partial.num_chains} "
        f"chain{'s' if partial.num_chains > 1 else ''}) are in error.partial"
    )
    chain = failure.chains[0]
    if failure.reason == "interrupted":
        raise RunInterrupted(
            f"{kind} was interrupted at step {failure.step} of chain {chain}. {kept} (of "
            f"{requested} requested).",
            partial=partial,
        )
    advice = (
        f" (step size {step_size:.3g}). The step size is too large for this model and data: try a "
        f"smaller step_size (e.g. {step_size / 10:.1g}) or step_size='auto', a decaying schedule, "
        "or less gradient noise (a larger batch_size)"
        if step_size is not None
        else ". Check the model's priors and data, or the initial values (init=...)"
    )
    raise InferenceError(
        f"{kind}: chain {chain} reached a non-finite potential or gradient (NaN or inf) at step "
        f"{failure.step}{advice}. {kept} (of {requested} requested).",
        partial=partial,
    )
