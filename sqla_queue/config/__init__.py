"""The settings: the catalogue, the environment, resolution, ranges."""
