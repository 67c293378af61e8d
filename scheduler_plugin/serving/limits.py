"""Bounds of the extender's HTTP edge, each with the reason for its value.

kube-scheduler is the only intended caller of the extender verbs; everything else reaching
the port is treated as hostile. These bounds keep one process (its memory limit in the
shipped Deployment is 512Mi) serving while clients send too much, too slowly or too often.
"""

from __future__ import annotations

from typing import Final

NODE_NAME_BYTES: Final = 256
"""A node name is a DNS subdomain (at most 253 characters), plus quotes and a comma."""
POD_BYTES: Final = 3 * 512 * 1024
"""The largest Pod the API server stores: etcd refuses requests over 1.5 MiB."""
CLUSTER_NODES: Final = 5_000
"""Kubernetes' supported cluster size, and the size tessera is benchmarked at."""
CAPTURED_NODE_BYTES: Final = 1_647
"""A Node object as kube-scheduler sends it with nodeCacheCapable false (measured from a
real kube-scheduler's requests; nodes with many images and labels are larger)."""

MAX_BODY_BYTES: Final = 4 * 1024 * 1024
"""Default largest request body. With nodeCacheCapable true (the shipped configuration)
kube-scheduler sends the Pod and the node names: at 5,000 nodes at most
POD_BYTES + CLUSTER_NODES x NODE_NAME_BYTES = 2.8 MB, rounded up to 4 MiB. With
nodeCacheCapable false it sends full Node objects (5,000 x 1,647 bytes = 8.2 MB as measured,
more with long image lists): such clusters raise --max-body-bytes (16 MiB holds Nodes of
about 3 KB each) and the memory limit with it."""
NODE_OBJECTS_BODY_BYTES: Final = 16 * 1024 * 1024
"""The suggested --max-body-bytes for nodeCacheCapable false (see MAX_BODY_BYTES)."""
MAX_BODY_LIMIT: Final = 256 * 1024 * 1024
"""The largest --max-body-bytes accepted: parsing costs about 10x the body in memory."""
BODY_BUDGET_BODIES: Final = 2
"""Request bodies held in memory at once, in units of the largest body: bodies wait for
room before they are read. Decisions run one at a time on the event loop, so a second body
can be read while the first is decided; more would only queue memory."""

MAX_JSON_DEPTH: Final = 64
"""Nesting of an extender request body. A real one nests 12 levels (a Pod's managedFields
add one per field path segment); 64 leaves room for deep pod specs and stops nesting
attacks long before the parser's recursion limit."""
MAX_HEADER_BYTES: Final = 64 * 1024
"""Request line plus headers. kube-scheduler sends a few hundred bytes; bearer tokens for
/debug are up to a few KB."""

MAX_CONNECTIONS: Final = 256
"""Open client connections per port; past it new ones are closed at once. kube-scheduler
holds one for its scheduling cycle and one per bind in flight (binding cycles run in
parallel); an idle connection costs a few KB (about 40 KB with TLS)."""
HEADER_TIMEOUT: Final = 10.0
"""Seconds from a connection's (or a request's) first byte to the end of its headers.
kube-scheduler writes a request at once; slower senders are closing-worthy (slowloris)."""
BODY_TIMEOUT: Final = 10.0
"""Seconds to receive a whole body once its headers are in: 4 MiB on a cluster network takes
milliseconds, and kube-scheduler's httpTimeout (10 s shipped) gives up by then anyway."""
KEEPALIVE_TIMEOUT: Final = 60.0
"""Seconds an idle keep-alive connection stays open. Go's HTTP client keeps idle
connections 90 s and retries a request on a connection the server closed while idle."""
H2_MAX_STREAMS: Final = 64
"""Requests at once on one HTTP/2 connection. kube-scheduler has one scheduling cycle and
its binding cycles in flight; the verb pool (BLOCKING_WORKERS) serves 16 binds at once, so
more streams would only queue."""
H2_UNREAD_BYTES: Final = 512 * 1024
"""Request body bytes one HTTP/2 connection may hold that the application has not read yet;
past it the connection's flow-control window stays shut until it reads. Each stream is
also held to the default 64 KiB window ahead of the application."""
H2_MAX_RESETS: Final = 200
"""Streams a client may reset within H2_RESET_WINDOW before its connection is closed:
kube-scheduler resets a stream only when a call times out; a flood of opened-and-reset
streams makes the server start work it then drops."""
H2_RESET_WINDOW: Final = 10.0
"""Seconds over which H2_MAX_RESETS is counted."""
BLOCKING_WORKERS: Final = 16
"""Threads for verbs that wait on the API server (bind) or are long (preempt, /debug
views): kube-scheduler's parallel binds queue here instead of each holding a thread."""
MAX_WATCHERS: Final = 4
"""Concurrent /debug/watch streams (each holds a thread while it waits for changes)."""
API_CONNECTIONS: Final = 32
"""Connections the blocking client keeps to the API server: one per verb thread that may
wait on it (BLOCKING_WORKERS: TokenReviews, and binds where a proxy is configured), one per
watch (pods, nodes, NodeDevices, Leases), the Lease renewals, the status writer and the
event recorder, with room to spare. Sized so that a burst of binds never opens a
connection beyond the pool only to close it. Binds awaited on the extender's event loop
keep their own, at most BLOCKING_WORKERS (kube_edge.loop_client)."""
AUTH_CACHE_SECONDS: Final = 10.0
"""How long a TokenReview + SubjectAccessReview answer for /debug is reused: a revoked token
or role binding takes effect within this time, and a client polling /debug costs the API
server two requests per interval at most."""
AUTH_CACHE_ENTRIES: Final = 1024
"""Cached authorization answers (oldest dropped first)."""
