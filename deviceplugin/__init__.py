"""tessera's node agent: discovers GPUs and RDMA NICs, advertises fractional resources to the
kubelet, tracks device health and publishes the node inventory (see docs/deviceplugin.md)."""

from kube_edge import lean as _lean

# Imported by the agent's dependencies but not used by it (about 3 MB): asyncio (grpcio's
# Cython core imports it for grpc.aio) and grpc.aio; the serialization package of
# cryptography, whose __init__ adds the SSH key formats to the PEM loaders tessera uses
# (tessera.record_keys imports those from its `base` submodule); html, whose __init__ loads
# the HTML entity tables, which the metrics server's http.server needs only to escape an
# error page. Any use still gets the whole package (kube_edge/lean.py).
_lean.defer_init("asyncio", "grpc.aio", "cryptography.hazmat.primitives.serialization", "html")
