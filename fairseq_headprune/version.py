"""The package version, in one place (setup.py, --version and the package root read it)."""

__version__ = "0.3.0"
