"""The kube-scheduler extender: every device decision, binding, recovery and observability."""

from kube_edge import lean as _lean

# uvicorn's package __init__ imports its command line (uvicorn.main, and with it click,
# about 1.5 MB) for `uvicorn.run`; the scheduler uses uvicorn.config and uvicorn.server, so
# it imports those submodules alone. Any other use still gets the whole package
# (kube_edge/lean.py).
_lean.defer_init("uvicorn")
