"""The extender decides as the simulator does: a slice of the synthetic trace replayed
through the real HTTP path (filter, prioritize, bind against tessera_testbed's API server)
lands every GPU pod on the same node and the same GPUs as `tessera-sim`'s replay of it,
with tessera's default policy learning the workload online on both sides. The extender
does not track host CPU and memory (kube-scheduler does), so the simulator replays
without them here (`Replayer(host=False)`)."""

from __future__ import annotations

from typing import Any

from tessera import resources as rn
from tessera.policy_registry import make_policy
from tessera_sim.replay import Replayer, arrival_order
from tessera_sim.runner import Trace, measure_workload
from tessera_sim.synthetic import synthetic_trace
from tessera_sim.variants import constrain_models
from tessera_testbed.apiserver import FakeApiServer
from tests.scheduler.helpers import heartbeat, serving

PODS = 60
"""Pods replayed: enough to fill several nodes, fill leftovers and fail some."""


def test_extender_places_a_trace_slice_as_the_simulator_does(fake: FakeApiServer) -> None:
    base = synthetic_trace(nodes=8, seed=3)
    # a third of the GPU pods limited to GPU models, so the scarce-model term takes part
    trace = Trace(base.name, base.nodes, tuple(constrain_models(base.pods, base.nodes, 0.33)))
    replayer = Replayer(trace.nodes, measure_workload(trace), ties="name", host=False)
    order = arrival_order(trace.pods, 11, replayer.capacity_milli)[:PODS]
    assert sum(bool(p.gpu_spec) for p in order) >= 10
    simulated = replayer.run(make_policy(rn.DEFAULT_POLICY), order, 11).placements

    names = sorted(n.name for n in trace.nodes)
    for node in trace.nodes:
        spec: dict[str, Any] = node.inventory().to_dict()
        fake.create("nodes", {"metadata": {"name": node.name}})
        fake.create(
            "nodedevices",
            {
                "apiVersion": rn.INVENTORY_API_VERSION,
                "kind": rn.INVENTORY_KIND,
                "metadata": {"name": node.name},
                "spec": spec,
            },
        )
        fake.create("leases", heartbeat(node.name))
    served: list[tuple[str, tuple[int, ...]] | None] = []
    with serving(fake, policy=rn.DEFAULT_POLICY) as cluster:
        for i, pod in enumerate(order):
            obj = pod.pod_dict(f"11-{i}")
            obj["metadata"]["namespace"] = "default"
            obj["metadata"].pop("uid")
            obj["status"] = {"phase": "Pending"}
            chosen = cluster.schedule(obj, names)
            if chosen is None:
                served.append(None)
                continue
            created = fake.get("pods", pod.name, "default")
            alloc = cluster.cache.pods.allocation(created["metadata"]["uid"])
            if alloc is None:  # a pod without devices has no allocation record
                assert not pod.num_gpu
                gpus: tuple[int, ...] = ()
            else:
                gpus = tuple(g.index for c in alloc.containers if c.counted for g in c.gpus)
            served.append((chosen, gpus))
    # pods without devices are kube-scheduler's to place (the extender is not asked about
    # them in a cluster, and with host CPU and memory untracked they change nothing here)
    gpu_pods = [i for i, pod in enumerate(order) if pod.num_gpu]
    assert len(gpu_pods) > PODS // 2
    assert sum(simulated[i] is None for i in gpu_pods) < len(gpu_pods) // 2
    assert [served[i] for i in gpu_pods] == [simulated[i] for i in gpu_pods]
