"""Sluiceway: a STOMP 1.2 message broker with Open Message Queue's flow control."""

__version__ = "0.1.0"
