"""tessera's containerd NRI plugin: applies the scheduler's allocation record when a
container is created (device nodes, environment, mounts) and moves allocated RDMA VF
network devices into pod network namespaces. See docs/nri_hook.md.

Layers, each with one job: the ttrpc library `tessera_ttrpc` underneath, `mux` (NRI's connection
multiplexer), `plugin` (the NRI plugin protocol), `adjust` (pure: record -> adjustment),
`devices` and `netdev` (host I/O), `enforce` (tessera's policy), `cli`.
"""
