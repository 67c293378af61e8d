"""`kubectl-tessera`: the kubectl plugin's command line.

    kubectl tessera nodes [NODE] [-o json]
    kubectl tessera pods [-n NS | -A] [-o json]
    kubectl tessera gangs [-n NS | -A] [-o json]
    kubectl tessera explain POD [-n NS] [--policy P] [-o json]

Exit status: 0 done, 1 the API server could not be read, 2 a usage error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from kube_edge.client import KubeClient, page_items
from kube_edge.errors import ApiError
from kubectl_tessera import explain as explain_view
from kubectl_tessera import gangs as gangs_view
from kubectl_tessera import nodes as nodes_view
from kubectl_tessera import pods as pods_view
from kubectl_tessera.config import KubectlConfig
from tessera.resources import (
    DEFAULT_HEARTBEAT_NAMESPACE,
    DEFAULT_NRI_PLUGIN_NAME,
    DEFAULT_POLICY,
    INVENTORY_GROUP,
    INVENTORY_PLURAL,
    INVENTORY_VERSION,
    NRI_REQUIRED_PLUGINS_POD_ANNOTATION,
    PLACEMENT_POLICIES,
    POD_GROUP_GROUP,
    POD_GROUP_LABEL,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
)
from tessera_cli import CliParser, config_from, exit_code
from tessera_cli.exit_codes import EXIT_FAILURE
from tessera_cli.values import namespace, nri_plugin_name, seconds

PROG = "kubectl tessera"
MAX_TIMEOUT_S = 3600.0
"""A request timeout beyond an hour is a typo, not a wish."""
INVENTORY_PATH = f"/apis/{INVENTORY_GROUP}/{INVENTORY_VERSION}/{INVENTORY_PLURAL}"


def _common() -> CliParser:
    common = CliParser(add_help=False)
    common.add_argument("--kubeconfig", help="path to the kubeconfig file")
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument(
        "-n", "--namespace", type=namespace, help="namespace (default: the context's)"
    )
    common.add_argument(
        "-o", "--output", choices=["table", "json"], default="table", help="output format"
    )
    common.add_argument(
        "--request-timeout",
        type=seconds(high=MAX_TIMEOUT_S),
        default=30.0,
        metavar="SECONDS",
        help="seconds one API request may take",
    )
    common.add_argument(
        "--heartbeat-namespace",
        default=DEFAULT_HEARTBEAT_NAMESPACE,
        type=namespace,
        help="where the node agents keep their heartbeat Leases",
    )
    return common


def _gpu_owner() -> CliParser:
    """The flag of the commands that judge pods as the scheduler does."""
    owner = CliParser(add_help=False)
    owner.add_argument(
        "--manage-nvidia-gpu",
        action="store_true",
        help="the scheduler runs with --manage-nvidia-gpu (tessera owns nvidia.com/gpu)",
    )
    return owner


def parser() -> CliParser:
    common = _common()
    gpu_owner = _gpu_owner()
    top = CliParser(
        prog=PROG,
        description="Inspect tessera's GPU and RDMA sharing.",
    )
    sub = top.add_subparsers(dest="command", required=True, parser_class=CliParser)
    n = sub.add_parser("nodes", parents=[common], help="devices, allocation and state per node")
    n.add_argument(
        "node",
        nargs="?",
        metavar="NODE",
        help="only this node, with its isolation layer in full and why it takes no GPU shares",
    )
    p = sub.add_parser("pods", parents=[common], help="pods holding tessera devices")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    g = sub.add_parser(
        "gangs",
        parents=[common, gpu_owner],
        help="gangs (PodGroups): members pending and bound, state, and why each waits",
    )
    g.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    e = sub.add_parser(
        "explain", parents=[common, gpu_owner], help="why a pending pod fits nowhere"
    )
    e.add_argument("pod", metavar="POD")
    e.add_argument(
        "--policy",
        choices=PLACEMENT_POLICIES,
        default=DEFAULT_POLICY,
        help="the scheduler's --policy (only its own pods' annotation overrides it)",
    )
    e.add_argument(
        "--nri-plugin-name",
        type=nri_plugin_name,
        default=DEFAULT_NRI_PLUGIN_NAME,
        metavar="NAME",
        help="the scheduler's --nri-plugin-name: a pod whose "
        f"{NRI_REQUIRED_PLUGINS_POD_ANNOTATION} annotation does not read is refused by the "
        "scheduler, and so here (default: %(default)s)",
    )
    e.add_argument(
        "--no-require-nri-plugin",
        dest="require_nri_plugin",
        action="store_false",
        help="the scheduler runs with --no-require-nri-plugin (that annotation is not read)",
    )
    return top


def _leases(kube: KubeClient, namespace: str) -> list[dict[str, Any]] | None:
    """The heartbeat Leases, or None when this user may not read them (403) or the
    namespace does not exist (404): the rest still prints."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    try:
        return list(kube.list_items(path))
    except ApiError as exc:
        if exc.status in (403, 404):
            return None
        raise


def _nodes(kube: KubeClient) -> list[dict[str, Any]]:
    """The Node objects, or none when this user may not list them: the table then has only
    the nodes that published NodeDevices."""
    try:
        return list(kube.list_items("/api/v1/nodes"))
    except ApiError as exc:
        if exc.status in (403, 404):
            return []
        raise


def _gang_objects(
    kube: KubeClient, namespace: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The PodGroups and the pods carrying the gang label, in `namespace` (None: all). No
    PodGroups when their CRD is not installed (404) or this user may not read them (403):
    the members still print, each gang waiting for its PodGroup."""
    scope = "" if namespace is None else f"/namespaces/{quote(namespace, safe='')}"
    groups_path = f"/apis/{POD_GROUP_GROUP}/{POD_GROUP_VERSION}{scope}/{POD_GROUP_PLURAL}"
    try:
        groups = list(kube.list_items(groups_path))
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
        groups = []
    pods_path = f"/api/v1{scope}/pods"
    pods = [
        item
        for page in kube.pages(pods_path, label_selector=POD_GROUP_LABEL)
        for item in page_items(page, kube.max_depth, pods_path)
    ]
    return groups, pods


def _emit(config: KubectlConfig, doc: Any, table: Callable[[], str]) -> None:
    if config.output == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(table())


def run(config: KubectlConfig, kube: KubeClient, namespace: str, now: float) -> int:
    if config.command == "nodes":
        node_rows = nodes_view.rows(
            kube.list_items(INVENTORY_PATH),
            _leases(kube, config.heartbeat_namespace),
            now,
            config.heartbeat_namespace,
            _nodes(kube),
        )
        if config.node is not None:
            node_rows = [r for r in node_rows if r.node == config.node]
            if not node_rows:
                sys.stderr.write(
                    f"error: no node {config.node} (no NodeDevices, and no Node labeled for "
                    "the node agent)\n"
                )
                return EXIT_FAILURE
            one = node_rows[0]
            _emit(config, nodes_view.as_json(node_rows)[0], lambda: nodes_view.render_node(one))
            return 0
        _emit(config, nodes_view.as_json(node_rows), lambda: nodes_view.render_rows(node_rows))
        return 0
    if config.command == "pods":
        path = (
            "/api/v1/pods"
            if config.all_namespaces
            else f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        )
        # one list of the heartbeat Leases: the use beside each grant
        pod_rows = pods_view.rows(kube.list_items(path), _leases(kube, config.heartbeat_namespace))
        _emit(config, pods_view.as_json(pod_rows), lambda: pods_view.render_rows(pod_rows))
        return 0
    if config.command == "gangs":
        groups, members = _gang_objects(kube, None if config.all_namespaces else namespace)
        gang_rows = gangs_view.rows(groups, members, nvidia_gpu=config.manage_nvidia_gpu, now=now)
        _emit(config, gangs_view.as_json(gang_rows), lambda: gangs_view.render_rows(gang_rows))
        return 0
    pod = kube.get(
        f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(config.pod, safe='')}"
    )
    if not isinstance(pod, dict):
        raise ApiError(200, "the pod answer is not an object")
    gang = None
    if gangs_view.gang_of(pod) is not None:
        groups, members = _gang_objects(kube, namespace)
        gang = gangs_view.row_of(
            pod, gangs_view.rows(groups, members, nvidia_gpu=config.manage_nvidia_gpu, now=now)
        )
    result = explain_view.explain(
        pod,
        list(kube.list_items(INVENTORY_PATH)),
        kube.list_items("/api/v1/pods"),
        _leases(kube, config.heartbeat_namespace),
        now,
        policy=config.policy,
        nvidia_gpu=config.manage_nvidia_gpu,
        nri_plugin=config.nri_plugin_name if config.require_nri_plugin else None,
        lease_namespace=config.heartbeat_namespace,
        gang=gang,
    )
    _emit(config, explain_view.as_json(result), lambda: explain_view.render_explanation(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = config_from(KubectlConfig, parser().parse_args(argv))
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        kube = KubeClient.connect(
            config.kubeconfig,
            config.context,
            timeout=config.request_timeout,
            user_agent="kubectl-tessera",
        )
        return run(config, kube, config.namespace or kube.namespace, time.time())
    except ApiError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exit_code(exc)
    except BrokenPipeError:  # `| head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
