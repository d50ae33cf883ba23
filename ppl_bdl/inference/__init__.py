"""Inference drivers: NUTS and HMC, variational inference, SG-MCMC (reached through ``fit``)."""
