"""The scheduler's state: every node's devices and usability, every pod's allocation, the
binds in flight and the gangs' reservations, behind one lock (cache.py says the rule)."""
