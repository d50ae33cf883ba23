"""The NumPyro (JAX) backend: the backend itself, its distributions, compiled loop, random numbers,
optimizers, native samplers and device sharding."""
