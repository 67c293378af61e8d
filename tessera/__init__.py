"""Tessera's shared, I/O-free core: device model, requests, placement, state and records."""

__version__ = "0.1.0"
