"""What ``hessian="kron"`` needs of each layer kind: its Kronecker matrix's flat coordinates,
its input rows a (the factor A); the factor G is summed on the backend
(:mod:`~ppl_bdl.inference.laplace.layer_ggn`).

- ``nn.Dense`` (x W + b, W (in, out)): W̃ = [W; b] is (in + 1, out), a = [x, 1] per data point
  (every leading axis of x counts as one), g the gradient at s; the block is (A / N) ⊗ G.
- ``nn.Conv2d`` (W (out, in, kH, kW), groups=1): Grosse & Martens's (2016) KFC, with asdl's
  scaling: W̃ = [W as (out, in·kH·kW), b] is (out, in·kH·kW + 1), a the unfolded input patch
  with a 1 appended at each of the T output positions, g the gradient at each position; the
  input factor is Σ a aᵀ / T (the positions' mean), the output factor Σ g gᵀ (their sum), and
  the block is G ⊗ (A / N), its rows the output channels.
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.dsl.nn.conv import Conv2d
from ppl_bdl.dsl.nn.layers import Dense
from ppl_bdl.errors import ConfigError

#: The layer kinds ``hessian="kron"`` factors.
KINDS = (Dense, Conv2d)


def check_layer(call) -> None:
    """A ConfigError for a layer whose weight is Gaussian but that ``"kron"`` cannot factor."""
    layer = call.layer
    if not isinstance(layer, KINDS):
        raise ConfigError(
            f"hessian='kron' supports nn.Dense and nn.Conv2d layers; "
            f"{layer.describe(call.path)} is a {type(layer).__name__}. Use hessian='diag', or "
            "subset='last_layer' when the last layer is Dense."
        )
    if isinstance(layer, Conv2d) and layer.groups != 1:
        raise ConfigError(
            f"hessian='kron' factors Conv2d layers with groups=1; {layer.describe(call.path)} "
            f"has groups={layer.groups}. Use hessian='diag'."
        )


def coordinates(layer, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """W̃'s flat coordinates from the weight's and the bias's (None: not Gaussian)."""
    if isinstance(layer, Dense):
        coords = weight.reshape(layer.in_features, layer.out_features)
        return coords if bias is None else np.vstack([coords, bias[None]])
    coords = weight.reshape(layer.out_channels, -1)
    return coords if bias is None else np.hstack([coords, bias[:, None]])


def input_factor(layer, x: np.ndarray, with_bias: bool) -> np.ndarray:
    """Σ a aᵀ over the rows of one call's input (Conv2d: over patches, divided by T)."""
    if isinstance(layer, Dense):
        rows, positions = x.reshape(-1, layer.in_features), 1
    else:
        rows, positions = _patches(layer, x)
    if with_bias:
        rows = np.hstack([rows, np.ones((len(rows), 1))])
    return rows.T @ rows / positions


def kronecker_order(layer, input_side: np.ndarray, output_side: np.ndarray):
    """(left, right): the factors in the order of W̃'s rows and columns."""
    if isinstance(layer, Dense):
        return input_side, output_side
    return output_side, input_side


def _patches(layer: Conv2d, x: np.ndarray) -> tuple[np.ndarray, int]:
    """The unfolded input (N·T, in·kH·kW), C-ordered as the kernel's (in, kH, kW), and T."""
    (top, bottom), (left, right) = layer.padding
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.stride, layer.dilation
    height = (padded.shape[2] - dh * (kh - 1) - 1) // sh + 1
    width = (padded.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((x.shape[0], x.shape[1], kh, kw, height, width))
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (height - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (width - 1) + 1, sw)
            out[:, :, i, j] = padded[:, :, rows, cols]
    out = out.transpose(0, 4, 5, 1, 2, 3).reshape(x.shape[0] * height * width, -1)
    return out, height * width
