"""tessera's node agent: discovers GPUs and RDMA NICs, advertises fractional resources to the
kubelet, tracks device health and publishes the node inventory (see docs/deviceplugin.md)."""
