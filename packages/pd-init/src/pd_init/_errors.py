"""The error pd-init raises for bad specs, shardings or configuration."""


class InitSpecError(ValueError):
    """A spec, group, sharding or the JAX configuration cannot give the promised values."""
