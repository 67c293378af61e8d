"""Attack runs: hostile inputs sent to every surface that reads untrusted bytes.

`make fuzz` (`python -m fuzz.run`) runs each `fuzz/surface_*.py` module in its own process
and writes the figures into docs/security.md. The short, always-on versions of the same
attacks are property-based tests under tests/ (hypothesis); these runs are the long ones.
"""
