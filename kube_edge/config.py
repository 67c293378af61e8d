"""Where the API server is and how to authenticate to it, found as kubectl finds it.

The official `kubernetes` client's loaders do the work (kubeconfig contexts, client
certificates, tokens, exec plugins, the CA, the in-cluster service account and its token
rotation); they are imported through `kube_edge.lean` so that a process loads only the
loader it uses, not the whole package.

Which configuration: an explicit kubeconfig path always wins. Without one, a process in a
pod (KUBERNETES_SERVICE_HOST set) whose KUBECONFIG / ~/.kube/config does not exist uses the
pod's service account; anything else reads the default kubeconfig (KUBECONFIG, then
~/.kube/config), so a kubeconfig mounted into a pod is still honoured.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kube_edge import lean
from kube_edge.errors import NO_ANSWER, ApiError

SERVICE_ACCOUNT_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""In a pod, the namespace of its service account (kubectl's default namespace there)."""


@dataclass(frozen=True)
class Cluster:
    """A loaded configuration: the client `Configuration` (host, TLS files, credentials and
    their refresh hook) and the namespace the chosen context or service account names."""

    configuration: Any
    namespace: str = "default"
    in_cluster: bool = False


def _one_line(text: object, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def wants_in_cluster(kubeconfig: str | None) -> bool:
    """The module doc's rule."""
    if kubeconfig or "KUBERNETES_SERVICE_HOST" not in os.environ:
        return False
    default = os.path.expanduser(os.environ.get("KUBECONFIG") or "~/.kube/config")
    return not os.path.exists(default.split(os.pathsep)[0])


def load_incluster(configuration: Any) -> None:
    """Fill `configuration` from the pod's service account (token, CA, API server)."""
    lean.load().load_incluster_config(client_configuration=configuration)


def load(kubeconfig: str | None = None, context: str | None = None) -> Cluster:
    """The configuration by the module doc's rule. Raises ApiError (status 0, reason
    `InvalidConfiguration`) when there is no usable one."""
    kube = lean.load()
    configuration = kube.Configuration()
    namespace = "default"
    try:
        if wants_in_cluster(kubeconfig):
            load_incluster(configuration)
            with contextlib.suppress(OSError, UnicodeDecodeError):
                namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or namespace
            return Cluster(configuration, namespace, in_cluster=True)
        kube.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
        contexts, active = lean.config_module("kube_config").list_kube_config_contexts(
            config_file=kubeconfig
        )
    except Exception as exc:  # the loaders raise ConfigException, OSError, YAML errors...
        raise ApiError(
            NO_ANSWER,
            f"cannot load the Kubernetes configuration: {_one_line(exc)}",
            reason="InvalidConfiguration",
        ) from None
    chosen = next((c for c in contexts if c.get("name") == context), None) or active
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    if isinstance(ns, str) and ns:
        namespace = ns
    return Cluster(configuration, namespace)


def for_host(
    host: str,
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> Cluster:
    """A configuration built from parts: a plain-HTTP server (tests, `kubectl proxy`), or
    HTTPS with a CA bundle, a client certificate and/or a bearer token."""
    configuration = lean.load().Configuration()
    configuration.host = host.rstrip("/")
    configuration.ssl_ca_cert = ca_file
    configuration.cert_file = cert_file
    configuration.key_file = key_file
    if token:
        configuration.api_key["authorization"] = f"Bearer {token}"
    return Cluster(configuration, namespace)
