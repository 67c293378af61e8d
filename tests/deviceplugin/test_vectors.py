"""A real kubelet's requests (tests/vectors/deviceplugin): decoded with our messages, and the
exact request bytes replayed against our server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from deviceplugin.server import API_VERSION
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from tessera_testbed.kubelet import KubeletSimulator
from tests.deviceplugin.helpers import make_agent, running

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
    """A node whose gpu0 units include the captured IDs gpu0-core-0..7."""
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


def test_captured_requests_replayed_against_our_server(
    vectors: Path, sock_dir: Path, one_gpu_topology: Path
) -> None:
    agent, _ = make_agent(sock_dir, str(one_gpu_topology))
    with KubeletSimulator(sock_dir) as kubelet, running(agent):
        kubelet.wait_registered(["tessera.dev/gpu-core"])
        endpoint = kubelet.endpoint("tessera.dev/gpu-core")

        raw = endpoint.call_raw(
            "GetDevicePluginOptions", (vectors / "002-GetDevicePluginOptions.pb").read_bytes()
        )
        assert pb.DevicePluginOptions.FromString(raw).get_preferred_allocation_available

        request = pb.PreferredAllocationRequest.FromString(
            (vectors / "004-GetPreferredAllocation.pb").read_bytes()
        )
        raw = endpoint.call_raw(
            "GetPreferredAllocation", (vectors / "004-GetPreferredAllocation.pb").read_bytes()
        )
        (preferred,) = pb.PreferredAllocationResponse.FromString(raw).container_responses
        available = set(request.container_requests[0].available_deviceIDs)
        assert len(preferred.deviceIDs) == request.container_requests[0].allocation_size == 3
        assert set(preferred.deviceIDs) <= available

        raw = endpoint.call_raw("Allocate", (vectors / "005-Allocate.pb").read_bytes())
        (container,) = pb.AllocateResponse.FromString(raw).container_responses
        assert dict(container.envs) == {}
        assert dict(container.annotations) == {"tessera.dev/dp-units-gpu-core": "gpu0:3"}

        raw = endpoint.call_raw(
            "PreStartContainer", (vectors / "006-PreStartContainer.pb").read_bytes()
        )
        assert raw == b""  # an empty PreStartContainerResponse
