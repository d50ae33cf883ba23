"""``device=``: where a fit's data and computation live, on every backend; clear errors for a
device that is not there. Tests that need CUDA are marked ``cuda`` and skip without one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


Y = np.random.default_rng(0).normal(1.0, 1.0, size=40)


def _has_cuda(backend: str) -> bool:
    return any(d.startswith("cuda") for d in bdl.backends.get(backend).devices())


@pytest.mark.parametrize("method", ["nuts", "sgld", "vi"])
def test_cpu_device_everywhere(backend, method):
    options = {
        "nuts": dict(num_warmup=20),
        "sgld": dict(num_warmup=20, step_size=1e-3, batch_size=10),
        "vi": dict(num_steps=50),
    }[method]
    post = bdl.fit(
        mean_model(Y),
        backend=backend,
        method=method,
        device="cpu",
        num_samples=20,
        progress=False,
        **options,
    )
    assert isinstance(post.samples["mu"], np.ndarray)
    pred = post.predict(mean_model(Y[:5]), device="cpu")
    assert isinstance(pred.mean, np.ndarray) and pred.mean.shape == (5,)


@pytest.mark.parametrize("device", ["cuda:7", "tpu", "quantum", "cuda:x"])
def test_a_device_that_is_not_there_is_a_clear_error(backend, device):
    if device == "cuda:7" and _has_cuda(backend):
        pytest.skip("this machine has CUDA devices; cuda:7 may exist")
    with pytest.raises(bdl.BackendError, match=device.split(":")[0]) as info:
        bdl.fit(
            mean_model(Y),
            backend=backend,
            device=device,
            num_warmup=5,
            num_samples=5,
            progress=False,
        )
    assert "cpu" in str(info.value)  # it lists the devices there are


def test_cuda_without_cuda_names_what_there_is(backend):
    if _has_cuda(backend):
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(bdl.BackendError, match=r"device='cuda'.*no .*(CUDA|cuda)") as info:
        bdl.fit(mean_model(Y), backend=backend, device="cuda", progress=False)
    assert "device='cpu'" in str(info.value)


def test_data_and_steps_live_on_the_named_jax_device():
    """JAX with two host devices (a subprocess: the count is fixed when JAX starts): a fit on
    cpu:1 puts the bound data there and runs its steps there."""
    if "numpyro" not in bdl.backends.available():
        pytest.skip("needs the numpyro backend")
    script = textwrap.dedent(
        """
        import numpy as np, ppl_bdl as bdl
        from ppl_bdl import dist

        @bdl.model
        def m(y):
            mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
            with bdl.plate("data", y.shape[0]) as idx:
                bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

        bound = m(np.ones(30))
        post = bdl.fit(bound, backend="numpyro", method="sgld", step_size=1e-3, batch_size=10,
                       device="cpu:1", num_warmup=10, num_samples=10, num_chains=2,
                       progress=False)
        be = bdl.backends.get("numpyro", device="cpu:1")
        (y,), _ = bound.data_for(be)
        print(be.device, [d.id for d in y.devices()], post.samples["mu"].shape)
        """
    )
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert out[:2] == ["cpu:1", "[1]"], out


@pytest.mark.cuda
@pytest.mark.parametrize("method", ["nuts", "sgld", "sghmc", "vi"])
def test_fit_on_cuda(backend, method):
    if not _has_cuda(backend):
        pytest.skip(f"no CUDA device for the {backend} backend here")
    options = {
        "vi": dict(num_steps=100),
        "sgld": dict(step_size=1e-3, batch_size=10),
        "sghmc": dict(step_size=1e-3, batch_size=10),
    }.get(method, {})
    post = bdl.fit(
        mean_model(Y),
        backend=backend,
        method=method,
        device="cuda",
        num_warmup=50,
        num_samples=50,
        progress=False,
        **options,
    )
    assert abs(post.samples["mu"].mean() - Y.mean()) < 0.6
    assert post.predict(mean_model(Y[:5]), device="cuda").mean.shape == (5,)


def test_pyro_fits_flush_subnormals_on_the_cpu_and_restore_torch_default():
    """As XLA does on the CPU: subnormal floats (a saturated softmax's gradient) are flushed to
    zero while a Pyro fit runs (they made a step 2.5x slower), and torch's default comes back."""
    torch = pytest.importorskip("torch")
    backend = bdl.backends.get("pyro")
    tiny = torch.tensor(1e-39)  # subnormal in float32
    assert float(tiny * 1.0) != 0.0
    with backend.scope():
        with backend.scope():  # nested scopes (a fit inside a fit's callback) switch it once
            pass
        assert float(tiny * 1.0) == 0.0
    assert float(tiny * 1.0) != 0.0
