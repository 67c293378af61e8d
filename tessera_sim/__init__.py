"""The trace simulator: replays the openb traces through tessera's core with the protocol of
Weng et al., "Beware of Fragmentation" (USENIX ATC 2023), and the paper's baselines.

Only this package does file I/O; the policies it runs are ordinary tessera policies.
"""
