"""tessera's one Kubernetes edge: configuration, the API client, informers, leader election.

Every component talks to the API server through this package (kube_edge.config loads the
configuration, kube_edge.client sends requests, kube_edge.informer lists and watches,
kube_edge.leader elects on a Lease) and sees one error type, kube_edge.errors.ApiError.
It imports no component.
"""

from kube_edge import lean as _lean

# before kube_edge.client imports urllib3 (see kube_edge/lean.py)
_lean.defer_init("urllib3.http2")
