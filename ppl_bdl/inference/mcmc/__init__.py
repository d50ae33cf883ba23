"""MCMC: the backends' NUTS and HMC, the SG-MCMC kernels (``kernels/``), their step sizes, schedules
and control variates."""
