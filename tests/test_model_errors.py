"""A shape error inside a model comes back as a ModelError naming the model, site and line.

The regression inputs are the "Trust" issue's: a matrix product whose contracting dimensions
disagree (JAX said only ``dot_general requires contracting dimensions ...``), and a broadcasting
mismatch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist

HERE = Path(__file__).resolve()


def _line_of(marker: str) -> int:
    lines = HERE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# {marker}"))


@bdl.model
def matmul_mismatch(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))  # X has 2 columns
    s = bdl.sample("s", dist.HalfNormal(1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, s), obs=None if y is None else y[idx])  # matmul


@bdl.model
def broadcast_mismatch(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx, 0] + w, 1.0), obs=y[idx])  # broadcast


@bdl.model
def between_sites(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
    mean = X @ w  # between
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mean[idx], 1.0), obs=y[idx])


@bdl.model
def inside_primitive():
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
    bdl.sample("z", dist.MultivariateNormal(w, np.eye(2)))  # inside


X = np.random.default_rng(0).normal(size=(20, 2))
Y = np.zeros(20)


def _fit(bound, backend):
    return bdl.fit(
        bound, backend=backend, num_warmup=5, num_samples=5, num_chains=1, progress=False
    )


@pytest.mark.parametrize(
    "model, marker, where",
    [
        (matmul_mismatch, "matmul", "in the arguments of site 'y'"),
        (broadcast_mismatch, "broadcast", "in the arguments of site 'y'"),
        (between_sites, "between", "after site 'w' (the last site computed)"),
    ],
)
def test_shape_error_names_model_site_and_line(backend, model, marker, where):
    with pytest.raises(bdl.ModelError) as info:
        _fit(model(X, Y), backend)
    message = str(info.value)
    assert message.startswith(f"model {model.name!r}: a shape error {where}"), message
    assert f"{HERE}:{_line_of(marker)}" in message
    cause = info.value.__cause__
    assert cause is not None and not isinstance(cause, bdl.PPLError)
    assert str(cause).split("\n")[0] in message  # the array library's own words are kept


def test_the_failing_primitive_is_named(backend):
    with pytest.raises(bdl.ModelError) as info:
        _fit(inside_primitive(), backend)
    message = str(info.value)
    assert "while computing site 'z'" in message and f"{HERE}:{_line_of('inside')}" in message


def test_predict_with_mismatched_inputs_names_the_site(backend):
    @bdl.model
    def reg(X, y=None):
        w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=None if y is None else y[idx])

    post = _fit(reg(X, Y), backend)
    with pytest.raises(
        bdl.ModelError, match="model 'reg': a shape error in the arguments of site 'y'"
    ):
        post.predict(reg(np.ones((4, 5))))


def test_other_errors_pass_through_unchanged(backend):
    @bdl.model
    def typo(X, y=None):
        w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
        bdl.sample("y", dist.Normal(w + "1", 1.0), obs=y)

    @bdl.model
    def bad_scale(X, y=None):
        bdl.sample("w", dist.Normal(0.0, -1.0))

    @bdl.model
    def interrupted(X, y=None):
        bdl.sample("w", dist.Normal(0.0, 1.0))
        raise KeyboardInterrupt

    with pytest.raises(TypeError) as info:
        _fit(typo(X, Y), backend)
    assert not isinstance(info.value, bdl.PPLError)
    with pytest.raises(bdl.DistributionError, match="site 'w'") as info:
        _fit(bad_scale(X, Y), backend)
    assert info.value.__cause__ is None
    with pytest.raises(KeyboardInterrupt):
        _fit(interrupted(X, Y), backend)


def test_a_lowered_model_raises_the_same_error():
    if "numpyro" not in bdl.backends.available():
        pytest.skip("the numpyro backend is not installed")
    import jax
    import numpyro

    native = matmul_mismatch(X, Y).lower("numpyro")
    with pytest.raises(bdl.ModelError, match="in the arguments of site 'y'"):
        with numpyro.handlers.seed(rng_seed=jax.random.PRNGKey(0)):
            native()


@pytest.mark.parametrize(
    "error, wrapped",
    [
        (TypeError("dot_general requires contracting dimensions to have the same shape"), True),
        (TypeError("add got incompatible shapes for broadcasting: (20,), (3,)."), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (20x2 and 3x4)"), True),
        (RuntimeError("The size of tensor a (20) must match the size of tensor b (3)"), True),
        (RuntimeError("shape '[-1, 3, 3]' is invalid for input of size 4"), True),
        (IndexError("index 5 is out of bounds for dimension 0 with size 3"), True),
        (ValueError("operands could not be broadcast together with shapes (3,) (4,)"), True),
        (TypeError("broadcast_to requires ndarray or scalar arguments, got <class 'list'>"), False),
        (TypeError("unsupported operand type(s) for +: 'ArrayImpl' and 'str'"), False),
        (TypeError("Abstract tracer value encountered where concrete value is expected"), False),
        (KeyError("shape"), False),
        (bdl.DistributionError("parameter batch shapes do not broadcast"), False),
    ],
)
def test_which_errors_are_shape_errors(error, wrapped):
    from ppl_bdl.dsl.model_errors import is_shape_error

    assert is_shape_error(error) is wrapped


@bdl.model
def short_data(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", 100) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])  # short


def test_data_shorter_than_its_plate_names_the_site_shapes_and_fix(backend):
    """80 observations under a plate of 100: the same error on both backends (JAX clamps the
    read and its bounds are checked after the run; torch raises as it reads), naming the site
    and its line, the data's shape seen, the plate's size expected, and what to do."""
    with pytest.raises(bdl.DataError) as info:
        bdl.fit(short_data(np.zeros(80)), backend=backend, method="vi", num_steps=5)
    message = str(info.value)
    assert message.startswith("model 'short_data': reads data past its end in the arguments of")
    assert f"site 'y', at {HERE}:{_line_of('short')}" in message
    assert "the data 'y' (shape (80,))" in message
    assert (
        "plate 'data' (size 100): it has 80 entries on that axis, the plate expects 100" in message
    )
    assert "Bind data with 100 entries on axis 0, or give the plate the data's size" in message
