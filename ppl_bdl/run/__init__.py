"""Running a fit: ``fit`` (resolve, prepare, run, diagnose) and the executors that place groups of
chains on devices, processes or a Ray cluster."""
