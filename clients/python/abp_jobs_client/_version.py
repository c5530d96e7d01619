"""The one place the client's version is written (pyproject.toml reads it)."""

__version__ = "0.2.0"
