"""The energy Pyro's NUTS differentiates on the Pyro backend: U and ∇U from one traced graph."""

import numpy as np
import pytest

from ppl_bdl.models import posteriordb as pdb

torch = pytest.importorskip("torch")
pytest.importorskip("pyro")


@pytest.mark.parametrize("traces", [True, False])
def test_energy_gradient_matches_autograd_of_the_potential(traces, monkeypatch):
    from pyro.ops.integrator import potential_grad

    from ppl_bdl.backends.pyro import mcmc
    from ppl_bdl.inference.setup import prepare
    from ppl_bdl.trace.layout import ModelDensity

    setup = prepare(pdb.examples()["eight_schools_centered"], "pyro", "float64", 0)
    backend = setup.backend
    density = ModelDensity(setup.bound, backend, setup.layout, setup.params)
    z = torch.as_tensor(np.random.default_rng(0).normal(size=setup.layout.dim))
    if not traces:  # tracing U and ∇U fails: the traced potential, autograd through it
        original = backend.trace
        monkeypatch.setattr(
            backend,
            "trace",
            lambda fn, args: fn if fn.__name__ == "value_and_grad" else original(fn, args),
        )
    energy = mcmc._traced_energy(backend, density.potential, density.data, z)
    with backend.scope():
        grads, value = potential_grad(lambda p: energy(p["theta"]), {"theta": z.clone()})
        x = z.clone().requires_grad_(True)
        expected = density.potential(x, density.data)
        (expected_grad,) = torch.autograd.grad(expected, x)
        node = type(energy(z.clone().requires_grad_(True)).grad_fn).__name__
    assert ("EnergyWithGradient" in node) == traces, node
    assert float(value) == pytest.approx(float(expected), rel=1e-10)
    np.testing.assert_allclose(grads["theta"].numpy(), expected_grad.numpy(), rtol=1e-8)
