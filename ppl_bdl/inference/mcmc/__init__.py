"""MCMC: NUTS (the backend's own), HMC (the core's), the SG-MCMC kernels (``kernels/``), their step sizes, schedules
and control variates."""
