"""The DSL a model is written with: primitives, the effect stack, control flow, sites, the model
decorator and bound data; the neutral distributions (``dist``) and networks (``nn``)."""
