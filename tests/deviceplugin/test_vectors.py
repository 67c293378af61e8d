"""A real kubelet's requests (tests/vectors/deviceplugin): decoded with our messages, and
replayed against our server: the exact bytes, and the same requests with the captured unit
IDs (`gpu0-core-<n>`, the capturing plugin's names) renamed to this plugin's IDs for the same
units (`<GPU UUID>::<n>`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from deviceplugin.server import API_VERSION
from fuzz.surface_deviceplugin import captured_id
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from tessera_testbed.kubelet import KubeletSimulator
from tests.deviceplugin.helpers import captured_request, make_agent, running

REQUESTS: dict[str, type[Message]] = {
    "001-Register-sent": pb.RegisterRequest,
    "002-GetDevicePluginOptions": pb.Empty,
    "003-ListAndWatch": pb.Empty,
    "004-GetPreferredAllocation": pb.PreferredAllocationRequest,
    "005-Allocate": pb.AllocateRequest,
    "006-PreStartContainer": pb.PreStartContainerRequest,
}
RESPONSES: dict[str, type[Message]] = {
    "002-GetDevicePluginOptions": pb.DevicePluginOptions,
    "003-ListAndWatch": pb.ListAndWatchResponse,
    "004-GetPreferredAllocation": pb.PreferredAllocationResponse,
    "005-Allocate": pb.AllocateResponse,
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_requests_decode_to_the_captured_json(vectors: Path, name: str) -> None:
    raw = (vectors / f"{name}.pb").read_bytes()
    captured = json.loads((vectors / f"{name}.json").read_text())
    message = REQUESTS[name].FromString(raw)
    decoded = json_format.MessageToDict(message, preserving_proto_field_name=True)
    assert decoded == captured["message"]
    assert message.SerializeToString() == raw  # same field numbers and wire types


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_captured_responses_parse_with_our_field_names(vectors: Path, name: str) -> None:
    captured = json.loads((vectors / f"{name}.json").read_text())["response"]
    message = json_format.ParseDict(captured, RESPONSES[name]())
    assert json_format.MessageToDict(message, preserving_proto_field_name=True) == captured


def test_our_register_request_is_encoded_like_the_captured_one(vectors: Path) -> None:
    ours = pb.RegisterRequest(
        version=API_VERSION,
        endpoint="peer-gpu-core.sock",
        resource_name="example.com/gpu-core",
        options=pb.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        ),
    )
    assert ours.SerializeToString() == (vectors / "001-Register-sent.pb").read_bytes()


@pytest.fixture
def one_gpu_topology(tmp_path: Path) -> Path:
    """A node with one GPU: units 0..7 of the captured IDs gpu0-core-0..7 exist on it."""
    path = tmp_path / "one.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "GPU-00000000-0000-4000-8000-000000000000",
                        "model": "Tesla T4",
                        "memoryMiB": 15360,
                        "pciBusId": "0000:3b:00.0",
                        "numaNode": 0,
                    }
                ]
            }
        )
    )
    return path


UUID = "GPU-00000000-0000-4000-8000-000000000000"


def _rename(message: Message, rename: Callable[[str], str]) -> Message:
    """A copy of a request with every device ID renamed (the other fields untouched)."""
    out = type(message)()
    out.CopyFrom(message)
    lists = []
    if isinstance(out, pb.PreferredAllocationRequest):
        for c in out.container_requests:
            lists += [c.available_deviceIDs, c.must_include_deviceIDs]
    elif isinstance(out, pb.AllocateRequest):
        lists += [c.devices_ids for c in out.container_requests]
    elif isinstance(out, pb.PreStartContainerRequest):
        lists.append(out.devices_ids)
    for ids in lists:
        renamed = [rename(u) for u in ids]
        del ids[:]
        ids.extend(renamed)
    return out


def _captured_number(unit: str) -> str:
    device, _, number = unit.partition("::")
    assert device == UUID
    return f"gpu0-core-{number}"


@pytest.mark.parametrize(
    "name", ["004-GetPreferredAllocation", "005-Allocate", "006-PreStartContainer"]
)
def test_renaming_changes_only_the_ids(vectors: Path, name: str) -> None:
    raw = (vectors / f"{name}.pb").read_bytes()
    captured = REQUESTS[name].FromString(raw)
    ours = _rename(captured, lambda u: captured_id(u, UUID))
    assert ours != captured
    assert _rename(ours, _captured_number).SerializeToString() == raw


def test_captured_requests_replayed_against_our_server(
    vectors: Path, sock_dir: Path, one_gpu_topology: Path
) -> None:
    agent, _ = make_agent(sock_dir, str(one_gpu_topology))

    def ours(name: str) -> bytes:
        captured = REQUESTS[name].FromString((vectors / f"{name}.pb").read_bytes())
        return _rename(captured, lambda u: captured_id(u, UUID)).SerializeToString()

    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered(["tessera.dev/gpu-core"])
        endpoint = kubelet.endpoint("tessera.dev/gpu-core")

        method = "GetDevicePluginOptions"
        raw = endpoint.call_raw(method, captured_request(vectors, method))
        assert pb.DevicePluginOptions.FromString(raw).get_preferred_allocation_available

        # as captured, the IDs are not this plugin's: refused, nothing counted
        for method in ("GetPreferredAllocation", "Allocate", "PreStartContainer"):
            with pytest.raises(grpc.RpcError) as refused:
                endpoint.call_raw(method, captured_request(vectors, method))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "unknown device ID 'gpu0-core-" in (refused.value.details() or "")
        assert agent.manager is not None
        assert agent.manager.servers["tessera.dev/gpu-core"].servicer.allocations == 0

        request = pb.PreferredAllocationRequest.FromString(ours("004-GetPreferredAllocation"))
        raw = endpoint.call_raw("GetPreferredAllocation", ours("004-GetPreferredAllocation"))
        (preferred,) = pb.PreferredAllocationResponse.FromString(raw).container_responses
        available = set(request.container_requests[0].available_deviceIDs)
        assert len(preferred.deviceIDs) == request.container_requests[0].allocation_size == 3
        assert set(preferred.deviceIDs) <= available

        raw = endpoint.call_raw("Allocate", ours("005-Allocate"))
        (container,) = pb.AllocateResponse.FromString(raw).container_responses
        assert dict(container.envs) == {}
        assert dict(container.annotations) == {"tessera.dev/dp-units-gpu-core": f"{UUID}:3"}

        raw = endpoint.call_raw("PreStartContainer", ours("006-PreStartContainer"))
        assert raw == b""  # an empty PreStartContainerResponse
