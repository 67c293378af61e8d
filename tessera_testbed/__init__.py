"""Simulated Kubernetes peers for the demo and the tests, speaking the real protocols (how to
use them: README.md).

- `apiserver`: an in-memory Kubernetes API server over HTTP on loopback (objects, watches,
  bindings, status subresources, faults and restarts for recovery tests);
- `kubelet`: a kubelet's device-plugin side over gRPC on unix sockets (registration that
  dials back, ListAndWatch, GetPreferredAllocation, Allocate, restarts);
- `containerd`: a container runtime's NRI side (mux + ttrpc over a unix socket).

Nothing in tessera's components imports this package (an import contract checks it).
"""
