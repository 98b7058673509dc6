"""stepsim's version: written here only (pyproject.toml reads it for the package metadata)."""

__version__ = "0.1.0"
