"""Sluiceway: a STOMP 1.2 message broker with Open Message Queue's flow control."""

# Before any other module of the package: which build of the per-message path is imported.
from sluiceway.compiled import BUILD

__all__ = ["BUILD"]
__version__ = "0.1.0"
