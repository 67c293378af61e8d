"""`bench_filter_latency` sends what kube-scheduler sends: the Pod as the API server stores
it, with each call's own name, UID and resources, read by the extender as the shape asked."""

from __future__ import annotations

import json

from bench.bench_filter import pod as bare_pod
from bench.bench_filter_latency import CAPTURED_FILTER, _captured_pod, requests, stored_pod
from bench.scale_common import SHAPES
from tessera.request import PodParser


def test_a_stored_pod_keeps_the_captured_body_and_asks_for_its_shape() -> None:
    parser = PodParser()
    captured = _captured_pod()
    for i, shape in enumerate(SHAPES):
        pod = stored_pod(i, dict(shape))
        meta = pod["metadata"]
        assert (meta["name"], meta["uid"]) == (f"bench-{i}", f"bench-uid-{i}")
        # what the API server adds to a created pod stays: managedFields, defaults, status
        assert meta["managedFields"] and pod["spec"]["tolerations"] and pod["status"]
        assert pod["spec"]["tolerations"] == captured["spec"]["tolerations"]
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources == {"limits": shape, "requests": shape}
        fields = meta["managedFields"][0]["fieldsV1"]["f:spec"]["f:containers"]
        listed = fields['k:{"name":"main"}']["f:resources"]["f:limits"]
        assert set(listed) == {"."} | {f"f:{name}" for name in shape}
        # the extender reads the same request as from a bare pod of the same shape
        request = parser.parse(pod)
        bare = parser.parse(bare_pod(i, dict(shape)))
        assert request.uid == bare.uid and request.shape() == bare.shape()
    # each call gets a copy: the template is never changed
    assert _captured_pod() == json.loads(CAPTURED_FILTER.read_text())["Pod"]


def test_the_requests_are_whole_http_calls_with_the_stored_pod() -> None:
    every = [f"node-{n:05d}" for n in range(50)]
    sent = requests(every, 10, 8, seed=3)
    assert len(sent) == 8
    for text in sent:
        head, body = text.split("\r\n\r\n", 1)
        length = int(head.split("Content-Length: ", 1)[1].split("\r\n", 1)[0])
        assert length == len(body.encode("latin-1"))
        args = json.loads(body)
        assert args["Nodes"] is None and len(args["NodeNames"]) == 10
        assert set(args["NodeNames"]) <= set(every)
        assert args["Pod"]["metadata"]["managedFields"]
