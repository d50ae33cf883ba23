"""The math namespace of the NumPyro backend: :mod:`ppl_bdl.math` on JAX arrays."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp


def make_math() -> SimpleNamespace:
    m = SimpleNamespace()
    for name in (
        "abs", "exp", "log", "log1p", "expm1", "sqrt", "square", "tanh", "sum", "mean", "var", "std",
        "max", "min", "prod", "cumsum", "matmul", "dot", "outer", "einsum", "transpose", "reshape",
        "expand_dims", "squeeze", "concatenate", "stack", "where", "clip", "zeros", "ones",
        "zeros_like", "ones_like", "full", "arange", "eye", "diag", "tril", "isfinite", "sin", "cos",
        "maximum", "minimum", "sign", "floor", "asarray", "logaddexp",
    ):  # fmt: skip
        setattr(m, name, getattr(jnp, name))
    m.sigmoid = jax.nn.sigmoid
    m.softplus = jax.nn.softplus
    m.relu = jax.nn.relu
    m.gelu = jax.nn.gelu
    m.elu = jax.nn.elu
    m.silu = jax.nn.silu
    m.softmax = jax.nn.softmax
    m.log_softmax = jax.nn.log_softmax
    m.logsumexp = jax.scipy.special.logsumexp
    m.erf = jax.scipy.special.erf
    m.lgamma = jax.scipy.special.gammaln
    m.digamma = jax.scipy.special.digamma
    m.cholesky = jnp.linalg.cholesky
    m.norm = jnp.linalg.norm
    m.triangular_solve = lambda a, b, lower=True: jax.scipy.linalg.solve_triangular(
        a, b, lower=lower
    )
    return m
