"""Synthetic images with known classes, for the image models' tests and examples (no downloads).

Class ``k`` of ``K`` is an oriented bar at angle ``π k / K`` through the centre, plus a blob on a
circle at angle ``2π k / K``, both shifted by a random offset of up to an eighth of the image,
in a class colour across the channels, plus Gaussian pixel noise. The classes are easy to tell
apart (the nearest class mean gets most images right): the data is for checking that models run,
learn and predict, not for comparing them.

Example
-------
>>> from ppl_bdl.models import images
>>> X, y = images.make_synthetic_images(n=12, num_classes=3, channels=1, size=8, seed=0)
>>> X.shape, X.dtype, y.tolist()[:6]
((12, 1, 8, 8), dtype('float32'), [0, 1, 2, 0, 1, 2])
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.errors import DataError


def _positive(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise DataError(
            f"make_synthetic_images: {name} must be an int >= {minimum}, got {value!r}."
        )
    return int(value)


def make_synthetic_images(
    n: int = 256,
    num_classes: int = 10,
    channels: int = 1,
    size: int = 28,
    noise: float = 0.3,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` NCHW images of ``num_classes`` classes: ``X`` float32 (n, channels, size, size) and
    integer labels ``y`` (n,), in 0..num_classes-1, cycling through the classes.

    Pixels lie in about [0, 1] before the noise (standard deviation ``noise``) is added.
    """
    n = _positive("n", n)
    num_classes = _positive("num_classes", num_classes, 2)
    channels = _positive("channels", channels)
    size = _positive("size", size, 4)
    if not (isinstance(noise, int | float) and np.isfinite(noise) and noise >= 0):
        raise DataError(f"make_synthetic_images: noise must be a number >= 0, got {noise!r}.")
    rng = np.random.default_rng(seed)
    y = np.arange(n) % num_classes
    grid = (np.arange(size) - (size - 1) / 2.0) / size  # pixel centres in [-1/2, 1/2]
    rows, cols = np.meshgrid(grid, grid, indexing="ij")
    shift = rng.uniform(-1 / 8, 1 / 8, size=(n, 2))
    r = rows[None] - shift[:, :1, None]
    c = cols[None] - shift[:, 1:, None]
    bar_angle = np.pi * y / num_classes
    # distance of each pixel to the line through the (shifted) centre at the class's angle
    dist = np.abs(r * np.cos(bar_angle)[:, None, None] - c * np.sin(bar_angle)[:, None, None])
    bar = np.exp(-0.5 * (dist / 0.06) ** 2)
    blob_angle = 2 * np.pi * y / num_classes
    br = 0.3 * np.sin(blob_angle)[:, None, None]
    bc = 0.3 * np.cos(blob_angle)[:, None, None]
    blob = np.exp(-0.5 * ((r - br) ** 2 + (c - bc) ** 2) / 0.1**2)
    pattern = 0.6 * bar + 0.8 * blob
    phase = 2 * np.pi * (y[:, None] / num_classes + np.arange(channels)[None] / channels)
    colour = 0.6 + 0.4 * np.cos(phase) if channels > 1 else np.ones((n, 1))
    X = colour[:, :, None, None] * pattern[:, None] + noise * rng.normal(
        size=(n, channels, size, size)
    )
    return X.astype(np.float32), y.astype(np.int64)
