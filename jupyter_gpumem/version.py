"""The package version, importable from every floor."""

__version__ = "0.1.0"
