"""The Pyro (PyTorch) backend: the backend itself, its distributions, loop, tensors, optimizers,
native samplers, devices and data-parallel steps."""
