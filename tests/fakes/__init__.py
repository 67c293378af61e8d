"""Reusable stand-ins for the peers tessera talks to: a kubelet (device plugin API over unix
sockets) and a Kubernetes API server (in-memory object store over HTTP). See README.md."""
