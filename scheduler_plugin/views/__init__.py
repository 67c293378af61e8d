"""What operators see: the allocation page and its views, /metrics, Events on pods and the
NodeDevices status."""
