"""The fail-closed gate, as a property over everything a container can meet at creation:
with or without the kubelet's tessera devices (the node agent's gate), with the hook
connected or away, with a record that names it, names another container, is garbage or is
missing, under either --on-invalid-record policy. Whatever happens, a container that
starts (the hook did not refuse it and runc took its mounts) and was given tessera
devices by the kubelet holds exactly its record's devices, or none at all only when the
operator chose `warn`; it never starts unadjusted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_hook.adjust import Settings, open_gate, plan_container
from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig, OnInvalid
from protos.nri import api_pb2 as api
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_edge.host_paths import NRI_GATE_DESTINATION
from tessera_edge.keyfiles import KeyringSource
from tessera_testbed.containerd import RuncRefusedError, make_container, make_pod, runc_create
from tessera_testbed.devnodes import device_numbers, make_device_nodes
from tessera_ttrpc import RpcError
from tests.keyfiles import write_public
from tests.nri_hook.gate_helpers import agent_answer

NODE = "gpu-node-1"
UID = "0c5e3a52-7d0f-4a53-9a54-0d7f2b7b1c11"
KEY = Keyring.generate("k1")
GPUS = (
    GpuGrant("GPU-00000000-1111-2222-3333-444444444444", 0, 0, 50, 40960),
    GpuGrant("GPU-11111111-1111-2222-3333-444444444444", 1, 1, 100, 81920),
)


ANSWER = agent_answer(f"{GPUS[0].uuid}::0")

records = st.one_of(
    st.none(),
    st.just("{garbage"),
    st.builds(
        lambda name, gpus: encode(
            PodAllocation(UID, "team-a", "train", NODE, (ContainerAllocation(name, gpus=gpus),)),
            KEY,
        ),
        st.sampled_from(["main", "other"]),
        st.lists(st.sampled_from(GPUS), min_size=1, max_size=2, unique=True).map(tuple),
    ),
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[HostDevices, Path]:
    root = tmp_path_factory.mktemp("gate")
    devices = make_device_nodes(root / "host", device_numbers(gpus=(0, 1), uverbs=()))
    return HostDevices(devices), write_public(KEY, root / "keys")


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    annotation=records,
    given_devices=st.booleans(),
    hook_connected=st.booleans(),
    on_invalid=st.sampled_from(["fail", "warn"]),
)
def test_a_container_given_devices_never_starts_unadjusted(
    node: tuple[HostDevices, Path],
    annotation: str | None,
    given_devices: bool,
    hook_connected: bool,
    on_invalid: OnInvalid,
) -> None:
    host, keys = node
    annotations = {ALLOCATION_ANNOTATION: annotation} if annotation is not None else {}
    pod = make_pod("train", namespace="team-a", uid=UID, annotations=annotations)
    container = make_container(pod, "main", allocated=[ANSWER] if given_devices else [])
    enforcer = Enforcer(
        EnforcerConfig(node_name=NODE, on_invalid=on_invalid), KeyringSource(keys), host
    )
    adjust: api.ContainerAdjustment | None = None
    if hook_connected:
        try:
            adjust = asyncio.run(enforcer.create_container(pod, container)).adjust
        except RpcError:
            assert on_invalid == "fail"
            return  # refused by the hook, saying why (test_enforce checks the words)
    try:
        runc_create(container, adjust)
    except RuncRefusedError as refused:
        assert given_devices and NRI_GATE_DESTINATION in str(refused)
        # refused only where the record was not applied: the hook away
        assert not hook_connected
        return
    # it starts: what does it hold?
    held = sorted(d.path for d in adjust.linux.devices) if adjust is not None else []
    if not given_devices:
        return  # untouched by the gate: the hook's other rules apply (test_enforce)
    assert hook_connected
    plan = None
    if annotation is not None and annotation != "{garbage":
        alloc = enforcer._decode(pod, annotation)
        plan = open_gate(plan_container(alloc, "main", Settings(), host), True)
    if plan is None:
        assert on_invalid == "warn" and held == [], "started with devices no record grants"
    else:
        assert held == sorted(d.path for d in plan.devices)
