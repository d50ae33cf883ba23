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


def _positive(
    name: str, value: object, minimum: int = 1, caller: str = "make_synthetic_images"
) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise DataError(f"{caller}: {name} must be an int >= {minimum}, got {value!r}.")
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


def make_stroke_images(
    n: int = 1000,
    num_classes: int = 10,
    channels: int = 1,
    size: int = 28,
    noise: float = 0.35,
    label_noise: float = 0.1,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """A harder image task, for comparing classifiers' accuracy *and* calibration: ``X`` float32
    (n, channels, size, size), labels ``y`` int64 (n,) drawn uniformly from 0..num_classes-1.

    Class ``k`` is a stroke at angle π k / K (plus a Gaussian jitter of 0.12 rad, so neighbouring
    classes, 18° apart for K = 10, overlap) of random length, width and position, and a blob on a
    circle at angle 2π (k mod K/2) / (K/2) (jitter 0.3 rad), so classes k and k + K/2 share it.
    Half of the images get a clutter stroke at a random angle and place; every image a random
    contrast in [0.5, 1.2] (and a random gain per channel), then Gaussian pixel noise ``noise``.
    Finally a fraction ``label_noise`` of the labels are replaced by a uniformly drawn class (which
    may be the same one), so even the best classifier's accuracy is about 1 − label_noise · (K −
    1)/K at most, and a network that fits its training labels exactly is over-confident. Draw the
    training and the test set from one call (or one seed) so they share the distribution.

    Example
    -------
    >>> X, y = make_stroke_images(n=6, size=16, seed=0)
    >>> X.shape, X.dtype, y.dtype
    ((6, 1, 16, 16), dtype('float32'), dtype('int64'))
    """
    n = _positive("n", n, caller="make_stroke_images")
    num_classes = _positive("num_classes", num_classes, 2, caller="make_stroke_images")
    channels = _positive("channels", channels, caller="make_stroke_images")
    size = _positive("size", size, 8, caller="make_stroke_images")
    for name, value, top in (("noise", noise, np.inf), ("label_noise", label_noise, 1.0)):
        if not (isinstance(value, int | float) and 0 <= value <= top):
            raise DataError(
                f"make_stroke_images: {name} must be a number in [0, {top}], got {value!r}."
            )
    rng = np.random.default_rng(seed)
    k = rng.integers(0, num_classes, size=n)
    grid = (np.arange(size) - (size - 1) / 2.0) / size  # pixel centres in [-1/2, 1/2]
    rows, cols = np.meshgrid(grid, grid, indexing="ij")

    def stroke(angle, centre, length, width):
        r = rows[None] - centre[:, :1, None]
        c = cols[None] - centre[:, 1:, None]
        across = r * np.cos(angle)[:, None, None] - c * np.sin(angle)[:, None, None]
        along = r * np.sin(angle)[:, None, None] + c * np.cos(angle)[:, None, None]
        return np.exp(-0.5 * (across / width[:, None, None]) ** 2) * (
            np.abs(along) < length[:, None, None]
        )

    shift = rng.uniform(-0.12, 0.12, size=(n, 2))
    angle = np.pi * k / num_classes + 0.12 * rng.normal(size=n)
    main = stroke(angle, shift, rng.uniform(0.2, 0.4, n), rng.uniform(0.04, 0.08, n))
    half = max(1, num_classes // 2)
    blob_angle = 2 * np.pi * (k % half) / half + 0.3 * rng.normal(size=n)
    centre = shift + 0.28 * np.stack([np.sin(blob_angle), np.cos(blob_angle)], axis=1)
    width = rng.uniform(0.07, 0.12, size=(n, 1, 1))
    r2 = (rows[None] - centre[:, :1, None]) ** 2 + (cols[None] - centre[:, 1:, None]) ** 2
    blob = np.exp(-0.5 * r2 / width**2)
    clutter = (
        stroke(
            rng.uniform(0, np.pi, n),
            rng.uniform(-0.3, 0.3, (n, 2)),
            np.full(n, 0.15),
            np.full(n, 0.05),
        )
        * (rng.uniform(size=n) < 0.5)[:, None, None]
    )
    pattern = main + 0.7 * blob + 0.6 * clutter
    gain = rng.uniform(0.5, 1.2, size=(n, 1)) * (
        rng.uniform(0.5, 1.0, size=(n, channels)) if channels > 1 else np.ones((n, 1))
    )
    X = gain[:, :, None, None] * pattern[:, None] + noise * rng.normal(
        size=(n, channels, size, size)
    )
    flip = rng.uniform(size=n) < label_noise
    y = np.where(flip, rng.integers(0, num_classes, size=n), k)
    return X.astype(np.float32), y.astype(np.int64)
