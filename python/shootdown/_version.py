"""The package version (from the installed distribution's metadata)."""

from __future__ import annotations

from importlib import metadata

__all__ = ["__version__"]

try:
    __version__: str = metadata.version("shootdown")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
