"""The installed tokmem's version, as a leaf module (so a low module can report it without importing the package)."""

from importlib.metadata import version

__version__ = version("tokmem")
