"""What a VI fit's compiled step depends on (:mod:`ppl_bdl.trace.programs`): another
VI fit of the same model with the same guide, objective and optimizer, at another seed, on
other data of the same shapes or with another learning rate, reuses its programs."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from ppl_bdl.inference.setup import Setup
from ppl_bdl.trace.programs import keyed, structure_key

#: Run options that change only the start, the host's chunking or (plain optimizers) an
#: input of the compiled step: the program does not depend on them.
PROGRAM_FREE_OPTIONS = ("init_loc", "chunk_size")
#: Guides whose seed sets their starting parameters only (a loop input); another guide's
#: seed may shape its program (a flow's autoregressive masks are drawn from it), so it is
#: part of the key.
SEED_FREE_GUIDES = ("meanfield", "lowrank", "fullrank", "delta")


def vi_transition_key(
    setup: Setup,
    guide_options: dict,
    run_options: dict,
    opt_config: Any,
    natural: bool,
    seed: int,
) -> Hashable | None:
    """The key of a VI transition: the model (:meth:`Setup.program_key`), the guide (by name;
    a guide object has no key: None), its options, the run's options but those that change a
    loop input only, the optimizer's settings (its lr too for a natural-gradient one) and
    the seed where the guide's program may depend on it (:data:`SEED_FREE_GUIDES`).

    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> from ppl_bdl.optim import OptimizerConfig
    >>> from ppl_bdl.inference.setup import prepare
    >>> @bdl.model
    ... def m(y):
    ...     bdl.sample("y", dist.Normal(bdl.sample("mu", dist.Normal(0.0, 1.0)), 1.0), obs=y)
    >>> setup = prepare(m(np.array(0.5)), "numpyro", "float32", seed=0)
    >>> key = lambda lr, seed: vi_transition_key(
    ...     setup, {}, {}, OptimizerConfig.build(lr=lr), False, seed)
    >>> key(0.1, 0) == key(0.01, 1)
    True
    """
    model = setup.program_key()
    if model is None:
        return None
    settings = dataclasses.asdict(opt_config)
    if not natural:
        settings.pop("lr", None)  # each step's lr is an input (the driver's Rates)
    runs = {k: v for k, v in sorted(run_options.items()) if k not in PROGRAM_FREE_OPTIONS}
    if not natural:
        runs.pop("lr", None)
    guide = run_options.get("guide", "meanfield")
    shaped_by_seed = not (isinstance(guide, str) and guide in SEED_FREE_GUIDES)
    return keyed(
        lambda: (
            "vi",
            seed if shaped_by_seed else None,
            model,
            structure_key(sorted(guide_options.items())),
            structure_key(list(runs.items())),
            structure_key(sorted(settings.items())),
        )
    )
