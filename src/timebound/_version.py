"""The package version, alone in a module so that any layer can read it without importing the
root package (which would load the public API)."""

__version__ = "0.1.0"
