"""The node agent's real Allocate answer, for the hook's fail-closed gate tests."""

from __future__ import annotations

import threading
from typing import cast

import grpc

from deviceplugin.server import DevicePluginServicer, ResourceState
from protos.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from tessera.resources import GPU


def agent_answer(unit: str) -> dp.ContainerAllocateResponse:
    """What the node agent answers the kubelet's Allocate for a container given `unit`
    (an ID of the gpu resource it advertises)."""
    state = ResourceState(GPU)
    state.known = frozenset({unit})
    request = dp.AllocateRequest()
    request.container_requests.add(devices_ids=[unit])
    servicer = DevicePluginServicer(state, threading.Event())
    answer = servicer.Allocate(request, cast(grpc.ServicerContext, None))
    result: dp.ContainerAllocateResponse = answer.container_responses[0]
    return result
