"""Hand-written JAX and torch code for ``image_bnn.py``: the networks and the training loops.

The anchors of the image benchmark, written straight against each library
(``lax.conv_general_dilated`` / ``torch.nn.functional.conv2d``, ``jax.value_and_grad`` in a jitted
``lax.scan`` / a plain loop with ``torch.autograd.grad``), without ``ppl_bdl``:

- ``forward(p, x)``: LeNet-5 or ResNet-20 on a dict of weights named as the ``ppl_bdl.dsl.nn`` sites
  (``lenet5.conv1.weight``, ...), so one set of weights runs in either;
- ``sgd``: SGD with momentum on the MAP objective (mean cross-entropy of the batch plus the
  Gaussian prior's ½ Σ λ_i w_i² / N, i.e. weight decay λ_i / N), the learning rate annealed to 0
  by a cosine; the baseline the Bayesian fits are scored against;
- ``sghmc`` and ``vi``: the same updates as our cSGHMC (cyclical step size, noise off in the
  exploration stage) and mean-field VI (reparameterised draw, closed-form KL, Adam) steps, only to
  time them against ``bdl.fit``.
"""

from __future__ import annotations

import math

import numpy as np

#: LeNet-5's layers: (kind, site, stride, padding) in order.
LENET = [
    ("conv", "conv1", 1, 2),
    ("pool",),
    ("conv", "conv2", 1, 0),
    ("pool",),
    ("flatten",),
    ("dense", "fc1"),
    ("dense", "fc2"),
    ("dense", "fc3"),
]


def forward(ops, net: str, p: dict, x):
    """Logits of LeNet-5 (``net="lenet5"``) or ResNet-20 (``"resnet20"``, no normalisation) with
    the weights ``p`` and the framework's ``ops`` (:class:`JaxOps` or :class:`TorchOps`)."""
    if net == "lenet5":
        for i, layer in enumerate(LENET):
            if layer[0] == "conv":
                name = f"lenet5.{layer[1]}"
                x = ops.relu(ops.conv(x, p[name + ".weight"], p[name + ".bias"], *layer[2:]))
            elif layer[0] == "pool":
                x = ops.maxpool2(x)
            elif layer[0] == "flatten":
                x = x.reshape(x.shape[0], -1)
            else:
                name = f"lenet5.{layer[1]}"
                x = x @ p[name + ".weight"] + p[name + ".bias"]
                x = ops.relu(x) if i < len(LENET) - 1 else x
        return x

    def conv(x, name, stride, pad):
        return ops.conv(x, p[f"{name}.weight"], p[f"{name}.bias"], stride, pad)

    x = ops.relu(conv(x, "resnet20.conv", 1, 1))
    for s in (1, 2, 3):
        for b in (1, 2, 3):
            name = f"resnet20.stage{s}.block{b}"
            stride = 2 if s > 1 and b == 1 else 1
            h = conv(ops.relu(conv(x, f"{name}.conv1", stride, 1)), f"{name}.conv2", 1, 1)
            short = conv(x, f"{name}.shortcut", stride, 0) if f"{name}.shortcut.weight" in p else x
            x = ops.relu(h + short)
    return x.mean(axis=(2, 3)) @ p["resnet20.fc.weight"] + p["resnet20.fc.bias"]


def init_weights(sites: dict, prior_scales: dict, seed: int = 0) -> dict:
    """He-normal weights (the prior's scale) and zero biases, as NumPy float32."""
    rng = np.random.default_rng(seed)
    return {
        name: (
            rng.normal(size=shape) * prior_scales[name]
            if name.endswith("weight")
            else np.zeros(shape)
        ).astype(np.float32)
        for name, shape in sites.items()
    }


def cyclical(t, total: int, cycles: int, base: float, cos):
    """α_t of the cyclical schedule (Zhang et al. 2020, Eq. 1), t from 0."""
    length = math.ceil(total / cycles)
    return base / 2 * (cos(math.pi * (t % length) / length) + 1)


def epoch_indices(n: int, batch: int, steps: int, seed: int) -> np.ndarray:
    """(steps, batch) minibatch indices, one shuffle per epoch."""
    rng = np.random.default_rng(seed)
    per = n // batch
    epochs = [
        rng.permutation(n)[: per * batch].reshape(per, batch) for _ in range(steps // per + 1)
    ]
    return np.concatenate(epochs)[:steps]


# -- JAX ------------------------------------------------------------------------------------------
class JaxOps:
    def __init__(self):
        import jax
        from jax import lax

        self.jax, self.lax = jax, lax

    def conv(self, x, w, b, stride, pad):
        out = self.lax.conv_general_dilated(
            x,
            w,
            (stride, stride),
            ((pad, pad), (pad, pad)),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )
        return out + b[None, :, None, None]

    def relu(self, x):
        return self.jax.nn.relu(x)

    def maxpool2(self, x):
        return self.lax.reduce_window(x, -np.inf, self.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def jax_setup(net, X, y, prior_scales, device):
    import jax
    import jax.numpy as jnp

    ops = JaxOps()
    dev = jax.devices("gpu" if device.startswith("cuda") else "cpu")[0]
    Xd, yd = jax.device_put(X, dev), jax.device_put(y.astype(np.int32), dev)
    prec = {k: 1.0 / s**2 for k, s in prior_scales.items()}

    def nll_sum(p, idx):
        logp = jax.nn.log_softmax(forward(ops, net, p, Xd[idx]))
        return -jnp.take_along_axis(logp, yd[idx][:, None], axis=1).sum()

    def prior_energy(p):
        return sum(0.5 * prec[k] * jnp.sum(v * v) for k, v in p.items())

    return jax, jnp, dev, nll_sum, prior_energy


def jax_sgd(net, X, y, prior_scales, weights, steps, batch, lr, momentum, device, seed=0):
    """The MAP weights after ``steps`` of SGD with momentum (cosine-annealed ``lr``)."""
    jax, jnp, dev, nll_sum, prior_energy = jax_setup(net, X, y, prior_scales, device)
    n = X.shape[0]

    def loss(p, idx):
        return nll_sum(p, idx) / batch + prior_energy(p) / n

    def body(carry, inputs):
        p, v = carry
        idx, rate = inputs
        value, g = jax.value_and_grad(loss)(p, idx)
        v = jax.tree_util.tree_map(lambda a, b: momentum * a + b, v, g)
        p = jax.tree_util.tree_map(lambda a, b: a - rate * b, p, v)
        return (p, v), value

    idxs = jax.device_put(epoch_indices(n, batch, steps, seed), dev)
    rates = jnp.asarray(lr * 0.5 * (1 + np.cos(np.pi * np.arange(steps) / steps)), jnp.float32)
    p = jax.device_put(weights, dev)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    (p, _), losses = jax.jit(lambda c, xs: jax.lax.scan(body, c, xs))((p, v), (idxs, rates))
    return {k: np.asarray(a) for k, a in p.items()}, np.asarray(losses)


def jax_predict(net, weights, X, chunk=1000):
    import jax

    ops = JaxOps()
    f = jax.jit(lambda p, x: jax.nn.softmax(forward(ops, net, p, x)))
    return np.concatenate(
        [np.asarray(f(weights, X[i : i + chunk]), np.float64) for i in range(0, X.shape[0], chunk)]
    )


def jax_loop(method, net, X, y, prior_scales, weights, batch, settings, device):
    """``run(steps)``: ``steps`` hand-written cSGHMC or mean-field VI steps (timing only)."""
    import optax

    jax, jnp, dev, nll_sum, prior_energy = jax_setup(net, X, y, prior_scales, device)
    n = X.shape[0]
    scale_n = n / batch
    p0 = jax.device_put(weights, dev)

    def noise_like(key, tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        keys = jax.random.split(key, len(leaves))
        return jax.tree_util.tree_unflatten(
            treedef, [jax.random.normal(k, a.shape) for k, a in zip(keys, leaves, strict=True)]
        )

    if method == "vi":
        tx = optax.adam(settings["lr"])
        rho = {
            k: jnp.full_like(a, math.log(math.expm1(0.01 * prior_scales[k]))) for k, a in p0.items()
        }
        q0 = {"loc": p0, "rho": rho}

        def loss(q, key, idx):
            scale = jax.tree_util.tree_map(jax.nn.softplus, q["rho"])
            eps = noise_like(key, q["loc"])
            w = jax.tree_util.tree_map(lambda m, s, e: m + s * e, q["loc"], scale, eps)
            kl = sum(
                jnp.sum(
                    math.log(prior_scales[k])
                    - jnp.log(scale[k])
                    + (scale[k] ** 2 + q["loc"][k] ** 2) / (2 * prior_scales[k] ** 2)
                    - 0.5
                )
                for k in q["loc"]
            )
            return scale_n * nll_sum(w, idx) + kl

        def body(carry, idx):
            q, opt, key, t = carry
            key, sub = jax.random.split(key)
            value, g = jax.value_and_grad(loss)(q, sub, idx)
            updates, opt = tx.update(g, opt, q)
            return (optax.apply_updates(q, updates), opt, key, t + 1), value

        init = (q0, tx.init(q0), jax.random.PRNGKey(0), 0)
    else:
        total, cycles = settings["total"], settings["cycles"]
        base, decay, explore = settings["step_size"], settings["momentum_decay"], 0.8
        length = math.ceil(total / cycles)

        def potential(p, idx):
            return scale_n * nll_sum(p, idx) + prior_energy(p)

        def body(carry, idx):
            p, v, key, t = carry
            key, sub = jax.random.split(key)
            rate = cyclical(t, total, cycles, base, jnp.cos)
            noisy = ((t % length) / length >= explore).astype(jnp.float32)
            value, g = jax.value_and_grad(potential)(p, idx)
            eps = noise_like(sub, p)
            sd = noisy * jnp.sqrt(2 * decay * rate)
            v = jax.tree_util.tree_map(
                lambda a, b, e: (1 - decay) * a - rate * b + sd * e, v, g, eps
            )
            p = jax.tree_util.tree_map(lambda a, b: a + b, p, v)
            return (p, v, key, t + 1), value

        init = (p0, jax.tree_util.tree_map(jnp.zeros_like, p0), jax.random.PRNGKey(0), 0)

    scan = jax.jit(lambda carry, idxs: jax.lax.scan(body, carry, idxs))

    def run(steps: int):
        idxs = jax.device_put(epoch_indices(n, batch, steps, 1).astype(np.int32), dev)
        jax.block_until_ready(scan(init, idxs))

    return run


# -- torch ----------------------------------------------------------------------------------------
class TorchOps:
    def __init__(self):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F

    def conv(self, x, w, b, stride, pad):
        return self.F.conv2d(x, w, b, stride, pad)

    def relu(self, x):
        return self.torch.relu(x)

    def maxpool2(self, x):
        return self.F.max_pool2d(x, 2)


def torch_setup(net, X, y, device):
    import torch

    ops = TorchOps()
    dev = torch.device(device)
    Xd, yd = torch.as_tensor(X, device=dev), torch.as_tensor(y, device=dev).long()

    def nll_sum(p, idx):
        logp = torch.log_softmax(forward(ops, net, p, Xd[idx]), dim=-1)
        return -logp.gather(1, yd[idx][:, None]).sum()

    return torch, dev, nll_sum


def torch_sgd(net, X, y, prior_scales, weights, steps, batch, lr, momentum, device, seed=0):
    """As :func:`jax_sgd`, in torch (``torch.optim.SGD``, weight decay λ_i / N per tensor)."""
    torch, dev, nll_sum = torch_setup(net, X, y, device)
    n = X.shape[0]
    p = {k: torch.as_tensor(a, device=dev).clone().requires_grad_() for k, a in weights.items()}
    groups = [
        {"params": [t], "weight_decay": 1.0 / (prior_scales[k] ** 2 * n)} for k, t in p.items()
    ]
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1 + math.cos(math.pi * t / steps))
    )
    idxs = torch.as_tensor(epoch_indices(n, batch, steps, seed), device=dev)
    losses = np.empty(steps)
    for t in range(steps):
        loss = nll_sum(p, idxs[t]) / batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses[t] = float(loss.detach()) if t % 50 == 0 or t == steps - 1 else np.nan
    return {k: t.detach().cpu().numpy() for k, t in p.items()}, losses


def torch_predict(net, weights, X, chunk=1000, device="cpu"):
    import torch

    ops = TorchOps()
    p = {k: torch.as_tensor(a, device=device) for k, a in weights.items()}
    out = []
    with torch.no_grad():
        for i in range(0, X.shape[0], chunk):
            x = torch.as_tensor(X[i : i + chunk], device=device)
            out.append(torch.softmax(forward(ops, net, p, x), -1).double().cpu().numpy())
    return np.concatenate(out)


def torch_loop(method, net, X, y, prior_scales, weights, batch, settings, device):
    """As :func:`jax_loop`, in torch (``torch.optim.Adam`` for VI, in-place SGHMC updates)."""
    torch, dev, nll_sum = torch_setup(net, X, y, device)
    n = X.shape[0]
    scale_n = n / batch
    g = torch.Generator(device=dev).manual_seed(0)
    names = list(weights)
    s = {k: float(prior_scales[k]) for k in names}

    if method == "vi":
        loc = {k: torch.as_tensor(weights[k], device=dev).clone().requires_grad_() for k in names}
        rho = {
            k: torch.full_like(loc[k], math.log(math.expm1(0.01 * s[k]))).requires_grad_()
            for k in names
        }
        opt = torch.optim.Adam([*loc.values(), *rho.values()], lr=settings["lr"])

        def one_step(t, idx):
            scale = {k: torch.nn.functional.softplus(rho[k]) for k in names}
            w = {
                k: loc[k] + scale[k] * torch.randn(loc[k].shape, generator=g, device=dev)
                for k in names
            }
            kl = sum(
                (
                    math.log(s[k])
                    - torch.log(scale[k])
                    + (scale[k] ** 2 + loc[k] ** 2) / (2 * s[k] ** 2)
                    - 0.5
                ).sum()
                for k in names
            )
            loss = scale_n * nll_sum(w, idx) + kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        p = {k: torch.as_tensor(weights[k], device=dev).clone().requires_grad_() for k in names}
        v = {k: torch.zeros_like(p[k]) for k in names}
        total, cycles = settings["total"], settings["cycles"]
        base, decay = settings["step_size"], settings["momentum_decay"]
        length = math.ceil(total / cycles)

        def one_step(t, idx):
            rate = cyclical(t, total, cycles, base, math.cos)
            sd = math.sqrt(2 * decay * rate) if (t % length) / length >= 0.8 else 0.0
            energy = sum(0.5 / s[k] ** 2 * (p[k] * p[k]).sum() for k in names)
            grads = torch.autograd.grad(scale_n * nll_sum(p, idx) + energy, list(p.values()))
            with torch.no_grad():
                for k, gr in zip(names, grads, strict=True):
                    noise = torch.randn(p[k].shape, generator=g, device=dev)
                    v[k].mul_(1 - decay).add_(-rate * gr + sd * noise)
                    p[k].add_(v[k])

    def run(steps: int):
        idxs = torch.as_tensor(epoch_indices(n, batch, steps, 1), device=dev)
        for t in range(steps):
            one_step(t, idxs[t])
        if dev.type == "cuda":
            torch.cuda.synchronize()

    return run
