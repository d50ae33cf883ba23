"""Bayesian image classifiers: LeNet-5, ResNet-20 (CIFAR variant) and the 784-400-400-10 MLP.

The networks are :mod:`ppl_bdl.dsl.nn` layers, so every model runs on every backend; images are NCHW.
:func:`make_classifier` turns a network into the model ``y ~ Categorical(logits = f_θ(x))`` with the
weights sampled once, outside the data plate, so a minibatch step runs only the batch.

- :func:`lenet5`: LeCun et al., *Gradient-based learning applied to document recognition*, 1998,
  Sec. II.B (C1 6@5x5, S2, C3 16@5x5, S4, F5 120, F6 84, output), with padding 2 on C1 so 28x28
  images play the role of the paper's 32x32; max pooling and ReLU by default (``pool="avg"``,
  ``activation="tanh"`` for the original).
- :func:`resnet20`: He et al., *Deep Residual Learning for Image Recognition*, 2016, Sec. 4.2:
  a 3x3 conv, three stages of three basic blocks at 16, 32, 64 channels (stride 2 between stages),
  global average pooling and a dense layer; ~0.27 M weights. The cyclical SG-MCMC experiments of
  Zhang et al. (2020) fit ResNets on CIFAR-10.
- :func:`mlp`: the DL-scale benchmark's 784-400-400-10 ReLU network (Blundell et al., *Weight
  Uncertainty in Neural Networks*, 2015, Sec. 5.1, on MNIST).

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.models import images, vision
>>> X, y = images.make_synthetic_images(n=32, num_classes=3, size=12, seed=0)
>>> model = vision.make_classifier(vision.lenet5(image_size=12, num_classes=3))
>>> post = bdl.fit(model(X, y), backend="pyro", method="vi", num_steps=5, batch_size=8,
...                num_samples=2, progress=False)
>>> post.samples["lenet5.conv1.weight"].shape
(1, 2, 6, 1, 5, 5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ModelError

NORMS = (None, "layer")


def make_classifier(net: nn.Module) -> bdl.Model:
    """The model ``y ~ Categorical(logits = net(X))``; bind it as ``model(X, y)`` with ``X``
    shaped as the network's input and integer labels ``y``. The model takes the network's name.

    Example
    -------
    >>> from ppl_bdl.models import vision
    >>> vision.make_classifier(vision.mlp(hidden=(20,)))
    <ppl_bdl.Model mlp>
    """
    if not isinstance(net, nn.Module):
        raise ModelError(
            f"make_classifier expects a ppl_bdl.dsl.nn network, got {type(net).__name__}."
        )

    def classifier(X, y=None):
        f = net.sample()  # global weights, outside the plate
        with bdl.plate("data", X.shape[0]) as idx:
            logits = f(X[idx])
            bdl.sample("y", dist.Categorical(logits=logits), obs=None if y is None else y[idx])

    classifier.__name__ = net.path
    return bdl.model(classifier)


def lenet5(
    name: str = "lenet5",
    in_channels: int = 1,
    image_size: int = 28,
    num_classes: int = 10,
    activation: str | Callable = "relu",
    pool: str = "max",
    prior: nn.Prior | None = None,
    p: float | None = None,
) -> nn.Sequential:
    """LeNet-5 for ``image_size`` x ``image_size`` images (at least 12): sites ``{name}.conv1``,
    ``conv2``, ``fc1``, ``fc2``, ``fc3`` (``.weight``, ``.bias``). ``prior`` defaults to
    :func:`~ppl_bdl.dsl.nn.he_normal`. ``p`` (None: none) puts an :class:`~ppl_bdl.dsl.nn.Dropout`
    of rate ``p`` before each dense layer, for MC dropout (Gal & Ghahramani 2016); the sites are
    the same.

    Example
    -------
    >>> from ppl_bdl.models import vision
    >>> vision.lenet5().num_weights()
    61706
    >>> vision.lenet5(p=0.1).sites() == vision.lenet5().sites()   # Dropout has no weights
    True
    """
    if pool not in ("max", "avg"):
        raise ModelError(f"lenet5: pool must be 'max' or 'avg', got {pool!r}.")
    after_conv2 = (image_size // 2 - 4) // 2
    if not isinstance(image_size, int) or after_conv2 < 1:
        raise ModelError(f"lenet5: image_size must be an int >= 12, got {image_size!r}.")
    Pool = nn.MaxPool2d if pool == "max" else nn.AvgPool2d

    def drop() -> list:
        return [] if p is None else [nn.Dropout(p)]

    return nn.Sequential(
        name,
        [
            nn.Conv2d("conv1", in_channels, 6, kernel_size=5, padding=2),
            activation,
            Pool(2),
            nn.Conv2d("conv2", 6, 16, kernel_size=5),
            activation,
            Pool(2),
            nn.Flatten(),
            *drop(),
            nn.Dense("fc1", 16 * after_conv2 * after_conv2, 120),
            activation,
            *drop(),
            nn.Dense("fc2", 120, 84),
            activation,
            *drop(),
            nn.Dense("fc3", 84, num_classes),
        ],
        prior=nn.he_normal() if prior is None else prior,
    )


def resnet20(
    name: str = "resnet20",
    in_channels: int = 3,
    num_classes: int = 10,
    width: int = 16,
    blocks_per_stage: int = 3,
    norm: str | None = None,
    image_size: int | None = None,
    prior: nn.Prior | None = None,
) -> nn.Sequential:
    """ResNet-20 (CIFAR variant; ``blocks_per_stage=n`` gives ResNet-(6n+2)).

    Batch norm is left out: its running statistics are state shared across a batch, with no clean
    Bayesian reading. ``norm=None`` (default) has no normalisation; ``norm="layer"`` puts a
    :class:`~ppl_bdl.dsl.nn.LayerNorm` over (C, H, W) with fixed gain and shift after each conv (it
    needs ``image_size``). Shortcuts that change the shape are 1x1 convs with stride 2 (the paper's
    option B). Sites: ``{name}.conv``, ``{name}.stage{s}.block{b}.conv1`` / ``conv2`` /
    ``shortcut``, ``{name}.fc``. Without ``prior``: :func:`~ppl_bdl.dsl.nn.he_normal` everywhere, and
    for the second conv of each block a gain shrunk by √L for the L blocks (Fixup's rescaling of
    the residual branches, Zhang, Dauphin & Ma, 2019, Sec. 3), so the prior's logits stay O(1)
    without normalisation. Any input size works (global average pooling).

    Example
    -------
    >>> from ppl_bdl.models import vision
    >>> vision.resnet20().num_weights()
    271690
    """
    if norm not in NORMS:
        raise ModelError(f"resnet20: norm must be one of {NORMS}, got {norm!r}.")
    if norm is not None and not isinstance(image_size, int):
        raise ModelError(f"resnet20: norm={norm!r} needs image_size (an int), got {image_size!r}.")
    num_blocks = 3 * blocks_per_stage
    default = prior is None
    branch_prior = nn.he_normal(math.sqrt(2.0 / num_blocks)) if default else None
    size = image_size

    def conv_norm(label: str, cin: int, cout: int, stride: int, conv_prior=None) -> list:
        nonlocal size
        conv = nn.Conv2d(
            label, cin, cout, 3, stride, padding=1, bias=norm is None, prior=conv_prior
        )
        if norm is None:
            return [conv]
        size = (size + 1) // stride if stride > 1 else size
        return [conv, nn.LayerNorm(f"{label}_norm", (cout, size, size), affine="fixed")]

    layers: list = [*conv_norm("conv", in_channels, width, 1), "relu"]
    channels = width
    for s in range(3):
        out = width * 2**s
        blocks = []
        for b in range(blocks_per_stage):
            stride = 2 if s > 0 and b == 0 else 1
            body = [
                *conv_norm("conv1", channels, out, stride),
                "relu",
                *conv_norm("conv2", out, out, 1, conv_prior=branch_prior),
            ]
            shortcut = None
            if stride != 1 or channels != out:
                shortcut = nn.Conv2d("shortcut", channels, out, 1, stride=stride)
            blocks.append(nn.Residual(f"block{b + 1}", body, shortcut, activation="relu"))
            channels = out
        layers.append(nn.Sequential(f"stage{s + 1}", blocks))
    layers += [nn.GlobalAvgPool2d(), nn.Dense("fc", channels, num_classes)]
    return nn.Sequential(name, layers, prior=nn.he_normal() if default else prior)


def mlp(
    name: str = "mlp",
    in_features: int = 784,
    hidden: Sequence[int] = (400, 400),
    num_classes: int = 10,
    activation: str | Callable = "relu",
    prior: nn.Prior | None = None,
) -> nn.Sequential:
    """The DL-scale benchmark's MLP, 784-400-400-10 ReLU by default; images are flattened first,
    so it takes (N, 784) or (N, 1, 28, 28). Sites ``{name}.fc1``, ``fc2``, ... ``prior`` defaults
    to N(0, 1).

    Example
    -------
    >>> from ppl_bdl.models import vision
    >>> vision.mlp().num_weights()
    478410
    """
    sizes = [in_features, *hidden, num_classes]
    layers: list = [nn.Flatten()]
    for i in range(len(sizes) - 1):
        if i:
            layers.append(activation)
        layers.append(nn.Dense(f"fc{i + 1}", sizes[i], sizes[i + 1]))
    return nn.Sequential(name, layers, prior=prior)


def make_lenet5_classifier(**kwargs) -> bdl.Model:
    """``make_classifier(lenet5(**kwargs))``."""
    return make_classifier(lenet5(**kwargs))


def make_resnet20_classifier(**kwargs) -> bdl.Model:
    """``make_classifier(resnet20(**kwargs))``."""
    return make_classifier(resnet20(**kwargs))


def make_mlp_classifier(**kwargs) -> bdl.Model:
    """``make_classifier(mlp(**kwargs))``."""
    return make_classifier(mlp(**kwargs))
