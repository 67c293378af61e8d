"""`make demo`: tessera end to end on a simulated cluster, over the real protocols.

Everything runs on this machine, no GPU and no Kubernetes needed:
1. an in-memory Kubernetes API server on loopback (tessera_testbed.apiserver);
2. one node agent per simulated node (fake NVML backend driven by a built-in topology),
   registering its resources with a simulated kubelet over gRPC on unix sockets and
   publishing its NodeDevices inventory and heartbeat Lease to the API server;
3. the scheduler extender over HTTP, which the demo calls exactly as kube-scheduler does
   (filter, prioritize, bind with kube-scheduler's JSON), so every pod gets its devices
   and its signed allocation record;
4. the kubelet admitting each pod: GetPreferredAllocation and Allocate on the node agent;
5. containerd creating each container: the NRI hook, over ttrpc on NRI's multiplexer,
   turns the record into device nodes and environment.
Then a short fragmentation comparison of the policies on a synthetic cluster.
"""

from __future__ import annotations

import os

# gRPC's C core reads this once, when it loads: keep its connection chatter out of the demo.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import asyncio
import functools
import hashlib
import json
import logging
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from deviceplugin.agent import Agent, AgentConfig
from deviceplugin.backend import GpuProcess
from deviceplugin.fake_backend import FakeBackend
from deviceplugin.inventory import InventoryConfig, InventoryPublisher
from deviceplugin.record_pods import list_node_pods
from deviceplugin.usage import MIB, GpuUse
from deviceplugin.usage_monitor import ApiPods, UsageMonitor
from kube_edge.client import KubeClient
from nri_hook.adjust import Settings
from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig
from nri_hook.plugin import NriPlugin
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from protos.nri import api_pb2 as nri
from scheduler_plugin.decisions.binder import BindArgs
from scheduler_plugin.service import Options, Service
from tessera import resources as rn
from tessera.model import NodeInventory
from tessera.policy_registry import POLICIES
from tessera.record import decode as decode_record
from tessera_cli.values import port, whole
from tessera_edge.keyfiles import KeyringSource, generate_key_files
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.containerd import RuntimeSimulator, make_container, make_pod, runc_create
from tessera_testbed.devnodes import device_numbers, make_device_nodes
from tessera_testbed.kubelet import KubeletSimulator

NODES = (("node-h100", "h100-sxm-8x"), ("node-a100", "a100-pcie-8x"), ("node-t4", "t4-4x"))
NAMESPACE = "ml"
ISOLATION = "hami-core"
"""The sharing layer the NRI hook configures (its limits show in the environment)."""


@dataclass(frozen=True)
class DemoPod:
    name: str
    containers: Mapping[str, Mapping[str, str]]
    annotations: Mapping[str, str] = field(default_factory=dict)
    note: str = ""


PODS = (
    DemoPod(
        "llm-finetune",
        {"main": {rn.GPU: "400", rn.RDMA: "50"}},
        {rn.TOPOLOGY_ANNOTATION: "nvlink", rn.RDMA_AFFINITY_ANNOTATION: "pcie"},
        "4 NVLink GPUs + an RDMA VF beside them",
    ),
    DemoPod("notebook-a", {"main": {rn.GPU: "25"}}, note="a quarter of a GPU"),
    DemoPod(
        "notebook-b",
        {"main": {rn.GPU_CORE: "30", rn.GPU_MEMORY: "10"}},
        note="30% compute, 10.0 GiB",
    ),
    DemoPod("inference", {"main": {rn.GPU: "50"}}, {rn.GPU_MODEL_ANNOTATION: "T4"}, "half a T4"),
    DemoPod(
        "trainer-pair",
        {"main": {rn.GPU: "200"}},
        {rn.TOPOLOGY_ANNOTATION: "pcie"},
        "2 GPUs behind one PCIe switch",
    ),
    DemoPod(
        "server-with-cache",
        {"main": {rn.GPU: "50"}, "cache": {rn.GPU_MEMORY: "4"}},
        note="two containers",
    ),
    DemoPod("batch-1", {"main": {rn.GPU: "10"}}),
    DemoPod("batch-2", {"main": {rn.GPU: "10"}}),
    DemoPod("too-big", {"main": {rn.GPU: "1600"}}, note="16 GPUs: no node has them"),
    DemoPod(
        "wrong-model", {"main": {rn.GPU: "50"}}, {rn.GPU_MODEL_ANNOTATION: "H200"}, "no H200 here"
    ),
    DemoPod("bad-request", {"main": {rn.GPU_CORE: "150"}}, note="150% is not a valid share"),
)


@dataclass
class Outcome:
    pod: DemoPod
    uid: str
    node: str = ""
    record: dict[str, Any] | None = None
    problem: str = ""
    admitted: list[str] = field(default_factory=list)
    allocated: dict[str, list[dp.ContainerAllocateResponse]] = field(default_factory=dict)
    """Container -> the device plugin's Allocate answers the kubelet got for it."""
    injected: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    container_ids: dict[str, str] = field(default_factory=dict)
    """Container -> the ID containerd gave it (its cgroup is named after it)."""


@dataclass
class SimNode:
    name: str
    topology: str
    plugin_dir: Path
    device_root: Path
    kubelet: KubeletSimulator
    agent: Agent
    backend: FakeBackend
    """The agent's fake NVML: the demo's workloads are its process lists."""
    units_in_use: set[str] = field(default_factory=set)

    @property
    def inventory(self) -> NodeInventory:
        return self.agent.inventory


class Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


# --- the pieces ------------------------------------------------------------------------------


def _device_nodes(root: Path, inventory: NodeInventory) -> None:
    """A node's /dev entries under `root`: real device nodes where mknod is allowed (root),
    else links to /dev/null, so the NRI hook reads types and numbers as on a host."""
    uverbs = [
        n for nic in inventory.nics for n in (nic.uverbs_minor, *(v.uverbs_minor for v in nic.vfs))
    ]
    make_device_nodes(root, device_numbers((g.minor for g in inventory.gpus), uverbs))


def _start_node(api: FakeApiServer, work: Path, name: str, topology: str) -> SimNode:
    api.create(
        "nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "96", "memory": "512Gi"}},
        },
    )
    plugin_dir = work / name / "device-plugins"
    plugin_dir.mkdir(parents=True)
    kubelet = KubeletSimulator(plugin_dir)
    kubelet.start()
    backend = FakeBackend.from_topology(topology)
    agent = Agent(
        AgentConfig(node_name=name, plugin_dir=plugin_dir, query_interval_s=0),
        backend,
        backend,
        publisher=InventoryPublisher(
            KubeClient.for_host(api.url, timeout=5), InventoryConfig(name)
        ),
    )
    agent.discover()
    agent.start()
    device_root = work / name / "host"
    _device_nodes(device_root, agent.inventory)
    return SimNode(name, topology, plugin_dir, device_root, kubelet, agent, backend)


def _post(url: str, body: Any) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _pod_object(pod: DemoPod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": NAMESPACE,
            "annotations": dict(pod.annotations),
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": c,
                    "image": "registry.example/ml:latest",
                    "resources": {"limits": dict(limits), "requests": dict(limits)},
                }
                for c, limits in pod.containers.items()
            ],
        },
        "status": {"phase": "Pending"},
    }


# --- the kube-scheduler side --------------------------------------------------------------------


def _schedule(base: str, api: FakeApiServer, pod: DemoPod, nodes: Sequence[str]) -> Outcome:
    """What kube-scheduler does with an extender: filter, prioritize (more than one node
    left), pick the best, bind. Bodies are kube-scheduler's (PascalCase, nodeCacheCapable)."""
    obj = api.create("pods", _pod_object(pod))
    uid = obj["metadata"]["uid"]
    outcome = Outcome(pod, uid)
    args = {"Pod": obj, "Nodes": None, "NodeNames": list(nodes)}
    filtered = _post(f"{base}/filter", args)
    if filtered.get("Error"):
        outcome.problem = filtered["Error"]
        return outcome
    passed = filtered.get("NodeNames") or []
    if not passed:
        reasons = {
            **filtered.get("FailedNodes", {}),
            **filtered.get("FailedAndUnresolvableNodes", {}),
        }
        by_reason: dict[str, list[str]] = {}
        for name, reason in sorted(reasons.items()):
            by_reason.setdefault(reason, []).append(name)
        outcome.problem = "; ".join(
            f"{', '.join(names) if len(names) < len(nodes) else 'every node'}: {reason}"
            for reason, names in by_reason.items()
        )
        return outcome
    chosen = passed[0]
    if len(passed) > 1:
        scores = _post(f"{base}/prioritize", {**args, "NodeNames": passed})
        best = max(scores, key=lambda s: (s["Score"], -passed.index(s["Host"])))
        chosen = best["Host"]
    bound = _post(
        f"{base}/bind",
        BindArgs(pod.name, NAMESPACE, uid, chosen).to_json(),
    )
    if bound.get("Error"):
        outcome.problem = f"bind: {bound['Error']}"
        return outcome
    stored = api.get("pods", pod.name, NAMESPACE)
    outcome.node = stored["spec"]["nodeName"]
    outcome.record = json.loads(stored["metadata"]["annotations"][rn.ALLOCATION_ANNOTATION])
    return outcome


# --- the kubelet side ------------------------------------------------------------------------


def _admit(node: SimNode, outcome: Outcome) -> None:
    """kubelet admission: for each container and tessera resource, pick unit IDs (asking
    the plugin for a preference) and Allocate them."""
    for container, limits in outcome.pod.containers.items():
        for resource, value in limits.items():
            endpoint = node.kubelet.endpoint(resource)
            snapshot = endpoint.latest()
            assert snapshot is not None
            available = [
                d.ID
                for d in snapshot.devices
                if d.health == "Healthy" and d.ID not in node.units_in_use
            ]
            count = int(value)
            preferred = node.kubelet.get_preferred_allocation(resource, available, [], count)
            chosen = (list(preferred) + [a for a in available if a not in preferred])[:count]
            answer = node.kubelet.allocate(resource, chosen)
            outcome.allocated.setdefault(container, []).append(answer)
            node.units_in_use.update(chosen)
            outcome.admitted.append(f"{resource.removeprefix(rn.DOMAIN + '/')}={len(chosen)}")


# --- the containerd side ---------------------------------------------------------------------


async def _create_containers(
    nodes: Mapping[str, SimNode], outcomes: Sequence[Outcome], key_file: Path, work: Path
) -> None:
    stops: list[tuple[asyncio.Event, asyncio.Task[None], RuntimeSimulator]] = []
    try:
        for node in nodes.values():
            placed = [o for o in outcomes if o.node == node.name]
            if not placed:
                continue
            socket_path = str(work / node.name / "nri.sock")
            runtime = RuntimeSimulator(socket_path)
            await runtime.start()
            enforcer = Enforcer(
                EnforcerConfig(
                    node_name=node.name,
                    settings=Settings(isolation=ISOLATION),
                    move_vf_netdevs=False,
                ),
                KeyringSource(key_file),
                HostDevices(node.device_root),
            )
            stop = asyncio.Event()
            plugin = NriPlugin(enforcer, name="tessera", index="50", socket_path=socket_path)
            task = asyncio.create_task(plugin.run(stop))
            stops.append((stop, task, runtime))
            conn = await runtime.next_plugin()
            for outcome in placed:
                meta = outcome.pod
                stored_annotations = dict(meta.annotations)
                assert outcome.record is not None
                stored_annotations[rn.ALLOCATION_ANNOTATION] = json.dumps(
                    outcome.record, sort_keys=True, separators=(",", ":")
                )
                sandbox = make_pod(
                    meta.name, namespace=NAMESPACE, uid=outcome.uid, annotations=stored_annotations
                )
                await conn.event(nri.RUN_POD_SANDBOX, sandbox)
                for container in meta.containers:
                    created = make_container(
                        sandbox,
                        container,
                        container_id=_container_id(outcome.uid, container),
                        allocated=outcome.allocated.get(container, ()),
                    )
                    outcome.container_ids[container] = created.id
                    response = await conn.create_container(sandbox, created)
                    # runc refuses the fail-closed gate unless the hook removed it
                    runc_create(created, response.adjust)
                    devices = [d.path for d in response.adjust.linux.devices]
                    env = {kv.key: kv.value for kv in response.adjust.env}
                    outcome.injected[container] = (devices, env)
    finally:
        for stop, task, runtime in stops:
            stop.set()
            await asyncio.wait_for(task, 5)
            await runtime.stop()


def _container_id(pod_uid: str, container: str) -> str:
    """A containerd-style ID (64 hex digits), the same for a pod's container every run."""
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


# --- what each share uses ------------------------------------------------------------------

WORKLOADS: Mapping[tuple[str, str], tuple[float, float]] = {
    ("llm-finetune", "main"): (0.92, 0.97),
    ("notebook-a", "main"): (0.35, 0.4),
    ("notebook-b", "main"): (0.8, 0.9),
    ("inference", "main"): (0.6, 0.7),
    ("trainer-pair", "main"): (0.88, 0.95),
    ("server-with-cache", "main"): (0.7, 0.8),
    ("server-with-cache", "cache"): (0.95, 0.0),
    ("batch-1", "main"): (0.5, 0.95),
    ("batch-2", "main"): (0.45, 0.9),
}
"""What each container's simulated process takes on each of its GPUs: (share of its
granted memory, share of its compute share). Placed containers not named run nothing."""


def _cgroup(pod_uid: str, container_id: str) -> str:
    """/proc/<pid>/cgroup of a process in that container (cgroup v2, systemd driver)."""
    pod = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


def _run_workloads(node: SimNode, outcomes: Sequence[Outcome], proc: Path) -> None:
    """Start the demo's workloads on `node`: one process per container and GPU, in the
    fake NVML's process lists and, with its cgroup, in a /proc of the node's own."""
    processes: dict[str, list[GpuProcess]] = {}
    pid = 1000
    for outcome in outcomes:
        if outcome.node != node.name or outcome.record is None:
            continue
        for c in outcome.record["containers"]:
            load = WORKLOADS.get((outcome.pod.name, c["name"]))
            if load is None or c.get("reuses"):
                continue
            for g in c.get("gpus", []):
                pid += 1
                (proc / str(pid)).mkdir(parents=True)
                (proc / str(pid) / "comm").write_text("python3\n")
                cid = outcome.container_ids[c["name"]]
                (proc / str(pid) / "cgroup").write_text(_cgroup(outcome.uid, cid))
                memory, compute = load
                processes.setdefault(g["uuid"], []).append(
                    GpuProcess(pid, int(g["memoryMiB"] * memory) * MIB, round(g["core"] * compute))
                )
    for uuid, listed in processes.items():
        node.backend.set_processes(uuid, tuple(listed))


def _container_statuses(api: FakeApiServer, outcomes: Sequence[Outcome]) -> None:
    """What the kubelet writes once the containers run: their IDs, by name."""
    for outcome in outcomes:
        if not outcome.container_ids:
            continue
        statuses = [
            {"name": name, "containerID": f"containerd://{cid}", "ready": True}
            for name, cid in outcome.container_ids.items()
        ]
        api.patch(
            "pods",
            outcome.pod.name,
            {"status": {"phase": "Running", "containerStatuses": statuses}},
            namespace=NAMESPACE,
            sub="status",
        )


def _read_usage(
    api: FakeApiServer,
    nodes: Mapping[str, SimNode],
    outcomes: Sequence[Outcome],
    keys: KeyringSource,
    work: Path,
) -> list[GpuUse]:
    """One reading of each node agent's usage loop over the demo's workloads: NVML's
    processes, put on their containers by cgroup and on their grants by the pods' records
    (listed from the API server and verified, as on a real node)."""
    _container_statuses(api, outcomes)
    client = KubeClient.for_host(api.url, timeout=5)
    rows: list[GpuUse] = []
    for node in nodes.values():
        proc = work / node.name / "proc"
        _run_workloads(node, outcomes, proc)
        pods = ApiPods(functools.partial(list_node_pods, client, node.name, 5.0), node.name, keys)
        monitor = UsageMonitor(node.backend, node.agent.gpu_indexes, pods, proc_root=proc)
        rows.extend(monitor.read_once().containers)
    return rows


def _usage_lines(rows: Sequence[GpuUse], outcomes: Sequence[Outcome]) -> list[str]:
    """Each container's use of each GPU share beside its grant (whole GPUs left out)."""
    node_of = {o.uid: o.node for o in outcomes}
    lines = []
    for u in sorted(rows, key=lambda r: (r.namespace, r.pod, r.container, r.gpu_index)):
        if u.granted_core == 100:
            continue
        sm = "-" if u.sm_percent is None else f"{u.sm_percent}%"
        compute = f"SM {sm} of its {u.granted_core}%" if u.granted_core else "no compute share"
        lines.append(
            f"  {u.pod + '/' + u.container:<24} {node_of.get(u.pod_uid, ''):<10} GPU{u.gpu_index}"
            f"  memory {gib(u.used_bytes // MIB)} of {gib(u.granted_memory_mib)}, {compute}"
        )
    return lines


# --- output ----------------------------------------------------------------------------------


def gib(mib: int) -> str:
    """GPU memory as the demo shows it everywhere: GiB with one decimal."""
    return f"{mib / 1024:.1f} GiB"


def _share(core: int, memory_mib: int) -> str:
    compute = "no compute share" if core == 0 else f"{core}% compute"
    return f"{compute}, {gib(memory_mib)}"


def _gpus_of(record: Mapping[str, Any], container: str) -> str:
    for c in record["containers"]:
        if c["name"] == container:
            parts = [
                f"GPU{g['index']}"
                + ("" if g["core"] == 100 else f" ({_share(g['core'], g['memoryMiB'])})")
                for g in c.get("gpus", [])
            ]
            parts += [
                f"{r['ibdev']} {r['share']}%"
                + (f" VF {r['vfs'][0]['ibdev']}" if r.get("vfs") else "")
                for r in c.get("rdma", [])
            ]
            suffix = f" (runs on {c['reuses']}'s devices)" if c.get("reuses") else ""
            return ", ".join(parts) + suffix
    return "-"


def _compact_devices(paths: Sequence[str]) -> str:
    gpus = [p.removeprefix("/dev/nvidia") for p in paths if p[len("/dev/nvidia") :].isdigit()]
    rest = [
        p for p in paths if not p[len("/dev/nvidia") :].isdigit() or not p.startswith("/dev/nvidia")
    ]
    shown = (
        [f"/dev/nvidia{{{','.join(gpus)}}}"] if len(gpus) > 1 else [f"/dev/nvidia{g}" for g in gpus]
    )
    return " ".join(shown + [p for p in rest if p not in ("/dev/nvidiactl", "/dev/nvidia-uvm")])


def _usage_table(base: str) -> list[str]:
    with urllib.request.urlopen(f"{base}/debug/nodes", timeout=10) as response:
        doc = json.loads(response.read())
    lines = []
    for node in doc.get("nodes", []):
        cells = []
        for g in node.get("gpus", []):
            used = g["core"]["total"] - g["core"]["free"]
            cells.append(f"{used:3d}%")
        lines.append(f"  {node['node']:<10} GPU compute in use: {' '.join(cells)}")
    return lines


# --- the run ---------------------------------------------------------------------------------


@contextmanager
def _quiet_logs() -> Iterator[None]:
    root = logging.getLogger()
    previous = root.level
    root.setLevel(logging.ERROR)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        yield
    finally:
        root.setLevel(previous)


RESOURCE_LEGEND = (
    (rn.GPU, "compute and memory together, in percent of one GPU (100 per GPU)"),
    (rn.GPU_CORE, "compute alone, in percent of one GPU (100 per GPU)"),
    (rn.GPU_MEMORY_RATIO, "memory, in percent of one GPU's memory (100 per GPU)"),
    (rn.GPU_MEMORY, "memory, in units of {unit} (each GPU's memory, rounded down)"),
    (rn.RDMA, "a share of an RDMA NIC, in percent (100 per NIC)"),
)


def _legend(unit_mib: int) -> list[str]:
    """Why the kubelet's five counts are not five pools."""
    lines = [
        "      The kubelet counts each resource on its own, but they are five ways to ask",
        "      for the same devices, not five pools to add up:",
    ]
    width = max(len(r.removeprefix(rn.DOMAIN + "/")) for r, _ in RESOURCE_LEGEND)
    for resource, meaning in RESOURCE_LEGEND:
        name = resource.removeprefix(rn.DOMAIN + "/")
        lines.append(f"        {name:<{width}}  {meaning.format(unit=gib(unit_mib))}")
    lines += [
        "      A container asks for gpu, or for gpu-core with one memory bound; tessera keeps",
        "      one account per GPU, so 800 gpu and 800 gpu-core on a node are the same 8 GPUs.",
    ]
    return lines


def _start_nodes(
    stack: ExitStack, api: FakeApiServer, work: Path, say: Printer
) -> dict[str, SimNode]:
    nodes: dict[str, SimNode] = {}
    for name, topology in NODES:
        node = _start_node(api, work, name, topology)
        stack.callback(node.kubelet.stop)
        stack.callback(node.agent.stop)
        nodes[name] = node
    for node in nodes.values():
        resources = [r for r in rn.TESSERA_RESOURCES if r in node.agent.units]
        node.kubelet.wait_registered(resources, timeout_s=10)
        counts = []
        for r in resources:
            snapshot = node.kubelet.endpoint(r).wait_for(lambda m: bool(m.devices))
            counts.append(f"{r.removeprefix(rn.DOMAIN + '/')}={len(snapshot.devices)}")
        inv = node.inventory
        model = inv.gpus[0].model if inv.gpus else "-"
        memory = gib(inv.gpus[0].memory_mib) if inv.gpus else "-"
        say(
            f"      {node.name:<10} {len(inv.gpus)}x {model} ({memory} each), "
            f"{len(inv.nics)} RDMA NICs"
        )
        say(f"      {'':<10} kubelet sees: {', '.join(counts)}")
    units = {n.inventory.memory_unit_mib for n in nodes.values()}
    for line in _legend(units.pop() if len(units) == 1 else 1024):
        say(line)
    return nodes


def _start_scheduler(
    stack: ExitStack,
    api: FakeApiServer,
    keyring: KeyringSource,
    policy: str,
    nodes: Sequence[str],
    port: int = 0,
) -> Service:
    options = Options(
        host="127.0.0.1", port=port, policy=policy, leader_elect=False, open_debug=True
    )
    service = Service(options, KubeClient.for_host(api.url), keyring).start()
    stack.callback(service.stop)
    if not service.wait_ready(20):
        raise RuntimeError("the scheduler extender did not become ready")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        summaries = [service.cache.node_summary(n) for n in nodes]
        if all(s is not None and not s.get("problem") for s in summaries):
            return service
        time.sleep(0.05)
    raise RuntimeError("the simulated nodes did not become usable for the scheduler")


def _describe(pod: DemoPod) -> str:
    asks = "; ".join(
        f"{c}: " + ", ".join(f"{k.removeprefix(rn.DOMAIN + '/')}={v}" for k, v in lim.items())
        for c, lim in pod.containers.items()
    )
    return f"  {NAMESPACE + '/' + pod.name:<22} {asks}" + (f"  ({pod.note})" if pod.note else "")


def _hami_mib(value: str) -> int:
    """HAMi-core's limit as the hook writes it (`<MiB>m`) back to MiB."""
    if not value.endswith("m"):
        raise ValueError(f"unexpected HAMi-core memory limit {value!r}")
    return int(value[:-1])


def _report_injections(say: Printer, outcomes: Sequence[Outcome]) -> None:
    for outcome in outcomes:
        for container, (devices, env) in outcome.injected.items():
            visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
            n_visible = len(visible.split(",")) if visible else 0
            memory = [
                gib(_hami_mib(v))
                for k, v in sorted(env.items())
                if k.startswith("CUDA_DEVICE_MEMORY_LIMIT")
            ]
            limits = []
            if memory:
                limits.append(
                    "memory "
                    + (
                        f"{memory[0]} x{len(memory)}"
                        if len(set(memory)) == 1 and len(memory) > 1
                        else ",".join(memory)
                    )
                )
            compute = [
                f"{v}%" for k, v in sorted(env.items()) if k.startswith("CUDA_DEVICE_SM_LIMIT")
            ]
            if compute:
                limits.append(f"SM {','.join(compute)}")
            say(
                f"  {outcome.pod.name + '/' + container:<24} {_compact_devices(devices):<44}"
                f" {n_visible} UUID{'s' if n_visible > 1 else ''} visible"
                + (f"; limits: {', '.join(limits)}" if limits else "")
            )


@dataclass(frozen=True)
class UiOptions:
    """Keep the cluster up for the allocation page (tessera_testbed.demo_ui)."""

    nodes: int = 200
    """Nodes added to the demo's three."""
    port: int = 8090
    seconds: float | None = None
    """Stop after this long (None: when interrupted)."""


def run(
    out: TextIO = sys.stdout,
    *,
    policy: str | None = None,
    with_simulation: bool = True,
    ui: UiOptions | None = None,
) -> list[Outcome]:
    """Run the demo, printing to `out`; the outcome of every pod (tests read them). With
    `ui`, the cluster then stays up for the allocation page until interrupted."""
    say = Printer(out)
    policy = policy or rn.DEFAULT_POLICY
    started = time.monotonic()
    say("tessera demo: a simulated cluster on this machine, every part over its real protocol")
    say()
    with ExitStack() as stack, _quiet_logs():
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tessera-demo-")))
        api = stack.enter_context(FakeApiServer())
        say(f"[1/6] API server (simulated, in memory) at {api.url}")
        # as an operator would: tessera-keys generate; the scheduler gets the private key,
        # the nodes only the public one
        private_key, public_key = generate_key_files(work / "record-keys", "demo")
        keyring = KeyringSource(private_key.parent, "sign")
        key_file = public_key.parent
        node_keys = KeyringSource(key_file)

        say("[2/6] node agents (fake NVML backend) register with their node's kubelet:")
        nodes = _start_nodes(stack, api, work, say)
        service = _start_scheduler(
            stack, api, keyring, policy, list(nodes), 0 if ui is None else ui.port
        )
        base = f"http://127.0.0.1:{service.server.port}"
        say(f"[3/6] scheduler extender at {base} (policy: {policy})")
        say()

        say("[4/6] scheduling as kube-scheduler calls an extender (filter, prioritize, bind):")
        outcomes = []
        for pod in PODS:
            outcome = _schedule(base, api, pod, list(nodes))
            outcomes.append(outcome)
            say(_describe(pod))
            if outcome.record is None:
                say(f"      -> stays Pending: {outcome.problem}")
                continue
            # what the node will check: the record verifies and belongs to this pod
            decode_record(json.dumps(outcome.record), node_keys.get(), pod_uid=outcome.uid)
            for container in pod.containers:
                placed_on = _gpus_of(outcome.record, container)
                say(f"      -> {outcome.node} {container}: {placed_on}")
            _admit(nodes[outcome.node], outcome)
            say(f"         kubelet admits it: Allocate {', '.join(outcome.admitted)} units")
        say()

        say(
            "[5/6] containerd creates the containers; the NRI hook injects devices and "
            f"{ISOLATION} limits:"
        )
        asyncio.run(_create_containers(nodes, outcomes, key_file, work))
        _report_injections(say, outcomes)
        say()
        say(
            "[6/6] what each GPU share uses beside its grant, as the node agents' usage loop "
            "reads it"
        )
        say("      (simulated workloads: one process per container and GPU, found by its cgroup):")
        for line in _usage_lines(_read_usage(api, nodes, outcomes, node_keys, work), outcomes):
            say(line)
        say()
        say("GPU compute in use per node, from the extender's debug API:")
        for line in _usage_table(base):
            say(line)
        placed = sum(1 for o in outcomes if o.node)
        say()
        say(
            f"{placed} of {len(outcomes)} pods placed, {len(outcomes) - placed} refused with "
            f"a reason, in {time.monotonic() - started:.1f} s"
        )
        if ui is not None:
            _serve_ui(say, api, service, list(nodes), ui)
            return outcomes
    if with_simulation:
        _simulation(say)
    return outcomes


def _serve_ui(
    say: Printer, api: FakeApiServer, service: Service, nodes: list[str], ui: UiOptions
) -> None:
    from tessera_testbed import demo_ui

    say()
    say(f"Growing the cluster by {ui.nodes} simulated nodes for the allocation page...")
    extra = demo_ui.add_nodes(api, ui.nodes)
    everyone = nodes + extra
    deadline = time.monotonic() + 120
    while len(service.cache.node_names()) < len(everyone) or service.cache.problems.by_node():
        if time.monotonic() > deadline:
            raise RuntimeError("the added nodes did not become usable for the scheduler")
        time.sleep(0.1)
    url = f"http://127.0.0.1:{service.server.port}/debug/ui"
    made = demo_ui.serve(api, service, everyone, extra, say, url=url, seconds=ui.seconds)
    say(f"{made} pods came while the page was served")


def _simulation(say: Printer) -> None:
    """How the policies compare on a synthetic cluster (the openb traces: make sim-table)."""
    from tessera_sim.cli import format_table
    from tessera_sim.synthetic import SYNTHETIC_POLICIES, run_synthetic

    nodes, seeds = 100, 5
    say()
    say(
        f"Fragmentation: {nodes} synthetic nodes, pods arriving until 130% of the GPUs are "
        f"asked for, {seeds} seeds per policy (lower is better):"
    )
    for line in format_table(
        run_synthetic(SYNTHETIC_POLICIES, nodes=nodes, seeds=seeds)
    ).splitlines():
        say("  " + line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera-demo",
        description=(
            "Run tessera end to end on a simulated cluster on this machine: node agents with a "
            "fake NVML backend, the scheduler extender called as kube-scheduler calls it, and "
            "the NRI hook driven as containerd drives it. No GPU or cluster needed."
        ),
    )
    parser.add_argument(
        "--policy",
        choices=sorted(POLICIES),
        default=None,
        help=f"node policy of the scheduler (default: {rn.DEFAULT_POLICY})",
    )
    parser.add_argument(
        "--no-simulation",
        action="store_true",
        help="skip the fragmentation comparison on a synthetic cluster at the end",
    )
    parser.add_argument(
        "--ui",
        action="store_true",
        help="then keep the cluster up, grown by --ui-nodes nodes, with pods arriving and "
        "finishing, and serve the allocation page (its URL is printed) until Ctrl-C",
    )
    parser.add_argument(
        "--ui-nodes",
        type=whole(0, 10000),
        default=UiOptions.nodes,
        metavar="N",
        help="nodes added for --ui (default: %(default)s)",
    )
    parser.add_argument(
        "--ui-port",
        type=port,
        default=UiOptions.port,
        metavar="PORT",
        help="loopback port of the page for --ui (0: any free port; default: %(default)s)",
    )
    parser.add_argument(
        "--ui-seconds", type=float, default=None, metavar="S", help="stop --ui after S seconds"
    )
    args = parser.parse_args(argv)
    ui = UiOptions(args.ui_nodes, args.ui_port, args.ui_seconds) if args.ui else None
    run(policy=args.policy, with_simulation=not args.no_simulation and ui is None, ui=ui)
    return 0


if __name__ == "__main__":
    sys.exit(main())
