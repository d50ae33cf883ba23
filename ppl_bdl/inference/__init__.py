"""Inference drivers: native NUTS/HMC, variational inference, SG-MCMC (reached through ``fit``)."""
