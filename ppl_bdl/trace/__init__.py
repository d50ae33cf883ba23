"""Running a model: the core's interpreter, lowering to a backend, the validating trace, enumeration
of discrete sites, the flat unconstrained layout and pointwise log densities."""
