from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.errors import RequestError
from tessera.request import READ_ANNOTATIONS, ContainerRequest, PodParser, PodRequest, parse_pod
from tessera.topology import Scope, Tier

from .builders import pod


def one(limits: dict[str, str], **kw: Any) -> ContainerRequest:
    request = parse_pod(pod(containers={"main": limits}, **kw))
    assert len(request.containers) == 1
    return request.containers[0]


def error(limits: dict[str, object] | None = None, **kw: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_pod(pod(containers={"main": limits or {}}, **kw))
    return info.value


def test_gpu_share_means_compute_and_memory_together() -> None:
    c = one({rn.GPU: "30"})
    assert (c.gpu_count, c.core, c.memory_ratio, c.memory_units) == (0, 30, 30, 0)
    assert c.is_share and c.wants_gpu and not c.wants_rdma
    assert c.memory_mib_on(81920, 1024) == 24576


@pytest.mark.parametrize(("value", "count"), [(100, 1), (200, 2), (800, 8)])
def test_gpu_multiples_of_100_are_whole_gpus(value: int, count: int) -> None:
    c = one({rn.GPU: str(value)})
    assert c.gpu_count == count and not c.is_share


def test_share_above_100_must_be_multiple_of_100() -> None:
    e = error({rn.GPU: "150"})
    assert e.container == "main" and e.resource == rn.GPU
    assert "multiple of 100" in str(e)


def test_compute_alone_needs_a_memory_bound() -> None:
    e = error({rn.GPU_CORE: "30"})
    assert e.resource == rn.GPU_CORE and "memory bound" in e.rule


def test_compute_with_memory_units_or_ratio() -> None:
    c = one({rn.GPU_CORE: "30", rn.GPU_MEMORY: "10"})
    assert (c.core, c.memory_units, c.memory_ratio) == (30, 10, 0)
    assert c.memory_mib_on(81920, 512) == 5120
    c = one({rn.GPU_CORE: "30", rn.GPU_MEMORY_RATIO: "25"})
    assert (c.core, c.memory_ratio) == (30, 25)


def test_memory_alone_is_a_share_without_compute_guarantee() -> None:
    c = one({rn.GPU_MEMORY: "8"})
    assert c.is_share and c.core == 0 and c.memory_units == 8


def test_memory_ratio_and_units_together_are_refused() -> None:
    e = error({rn.GPU_CORE: "10", rn.GPU_MEMORY_RATIO: "10", rn.GPU_MEMORY: "4"})
    assert "either" in e.rule


def test_gpu_cannot_combine_with_fine_grained_resources() -> None:
    e = error({rn.GPU: "50", rn.GPU_CORE: "50"})
    assert e.resource == rn.GPU and rn.GPU_CORE in e.rule


def test_nvidia_gpu_is_whole_gpus_and_exclusive() -> None:
    assert one({rn.NVIDIA_GPU: "2"}).gpu_count == 2
    assert error({rn.NVIDIA_GPU: "1", rn.GPU: "50"}).resource == rn.NVIDIA_GPU


def test_nvidia_gpu_left_alone_when_not_managed() -> None:
    request = parse_pod(pod(containers={"main": {rn.NVIDIA_GPU: "1"}}), nvidia_gpu_enabled=False)
    assert not request.wants_devices


def test_whole_compute_with_matching_or_absent_ratio() -> None:
    assert one({rn.GPU_CORE: "200"}).gpu_count == 2
    assert one({rn.GPU_CORE: "200", rn.GPU_MEMORY_RATIO: "200"}).gpu_count == 2
    e = error({rn.GPU_CORE: "200", rn.GPU_MEMORY_RATIO: "50"})
    assert e.resource == rn.GPU_MEMORY_RATIO
    e = error({rn.GPU_CORE: "100", rn.GPU_MEMORY: "40"})
    assert e.resource == rn.GPU_MEMORY and "all their memory" in e.rule


def test_whole_memory_ratio_alone_is_whole_gpus() -> None:
    assert one({rn.GPU_MEMORY_RATIO: "300"}).gpu_count == 3


def test_quantities_must_be_whole_numbers() -> None:
    for bad in ("0.5", "500m", "-1", "abc", True):
        e = error({rn.GPU: bad})
        assert e.resource == rn.GPU


def test_quantity_suffixes_that_are_whole_are_fine() -> None:
    assert one({rn.GPU_MEMORY: "1k", rn.GPU_CORE: "10"}).memory_units == 1000


def test_request_must_equal_limit() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": {rn.GPU: "50"}, "requests": {rn.GPU: "40"}}
    with pytest.raises(RequestError, match="must equal limit"):
        parse_pod(p)


def test_request_alone_counts() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"requests": {rn.GPU: "50"}}
    assert parse_pod(p).containers[0].core == 50


def test_unknown_tessera_resource_is_refused() -> None:
    e = error({"tessera.dev/gpu-cores": "10"})
    assert e.resource == "tessera.dev/gpu-cores" and "unknown" in e.rule


def test_other_resources_are_ignored() -> None:
    request = parse_pod(pod(containers={"main": {"cpu": "2", "example.com/foo": "1"}}))
    assert not request.wants_devices
    assert request.cpu_milli == 2000


def test_rdma_share_and_whole() -> None:
    assert one({rn.RDMA: "25"}).rdma_share == 25
    c = one({rn.RDMA: "200", rn.GPU: "100"})
    assert (c.rdma_count, c.rdma_share, c.gpu_count) == (2, 0, 1)
    assert error({rn.RDMA: "250"}).resource == rn.RDMA


def test_containers_without_devices_are_dropped_and_order_kept() -> None:
    request = parse_pod(
        pod(containers={"side": {"cpu": "1"}, "a": {rn.GPU: "10"}, "b": {rn.GPU: "200"}})
    )
    assert [c.name for c in request.containers] == ["a", "b"]


def test_host_requests_follow_kubernetes_rules() -> None:
    p = pod(
        containers={"a": {"cpu": "1", "memory": "1Gi"}, "b": {"cpu": "500m", "memory": "512Mi"}}
    )
    p["spec"]["initContainers"] = [
        {"name": "i1", "resources": {"requests": {"cpu": "3", "memory": "64Mi"}}},
        {"name": "sc", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
    ]
    p["spec"]["overhead"] = {"cpu": "100m"}
    request = parse_pod(p)
    # init i1 runs before the sidecar starts: max(1500 + 250, 3000) + overhead 100
    assert request.cpu_milli == 3100
    assert request.memory_mib == 1536


def test_init_containers_are_marked() -> None:
    request = parse_pod(pod(containers={"a": {rn.GPU: "50"}}, init={"i": {rn.GPU: "10"}}))
    assert [(c.name, c.init) for c in request.containers] == [("a", False), ("i", True)]


def test_hints_parse() -> None:
    request = parse_pod(
        pod(
            containers={"a": {rn.GPU: "200"}},
            annotations={
                rn.GPU_MODEL_ANNOTATION: "H100, A100",
                rn.GPU_UUID_EXCLUDE_ANNOTATION: "GPU-1",
                rn.TOPOLOGY_ANNOTATION: "nvlink",
                rn.RDMA_AFFINITY_ANNOTATION: "numa",
                rn.PLACEMENT_ANNOTATION: "spread",
            },
        )
    )
    h = request.hints
    assert h.models == {"H100", "A100"}
    assert h.excluded_uuids == {"GPU-1"}
    assert h.topology is Scope.NVLINK
    assert h.rdma_affinity is Tier.NUMA
    assert h.placement == "spread"


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        (rn.TOPOLOGY_ANNOTATION, "rack", "unknown topology scope"),
        (rn.RDMA_AFFINITY_ANNOTATION, "switch", "unknown value"),
        (rn.PLACEMENT_ANNOTATION, "first-fit", "unknown policy"),
        (rn.GPU_MODEL_ANNOTATION, "A100,,H100", "empty item"),
    ],
)
def test_bad_hints_name_the_annotation(key: str, value: str, needle: str) -> None:
    e = error({rn.GPU: "10"}, annotations={key: value})
    assert e.resource == key and needle in e.rule


def test_uuid_both_allowed_and_excluded() -> None:
    e = error(
        {rn.GPU: "10"},
        annotations={rn.GPU_UUID_ANNOTATION: "GPU-1", rn.GPU_UUID_EXCLUDE_ANNOTATION: "GPU-1"},
    )
    assert "both allowed" in e.rule


def test_more_whole_gpus_than_allowed_uuids() -> None:
    e = error({rn.GPU: "300"}, annotations={rn.GPU_UUID_ANNOTATION: "GPU-1,GPU-2"})
    assert e.container == "main" and "only 2 UUIDs" in e.rule


def test_hints_ignored_for_pods_without_devices() -> None:
    request = parse_pod(pod(annotations={rn.TOPOLOGY_ANNOTATION: "bogus"}))
    assert not request.wants_devices


@pytest.mark.parametrize("bad", [[], "x", {"metadata": [], "spec": {}}])
def test_malformed_pods_get_an_error(bad: Any) -> None:  # deliberately not a pod mapping
    with pytest.raises(RequestError):
        parse_pod(bad)


def test_container_without_name() -> None:
    p = pod()
    del p["spec"]["containers"][0]["name"]
    with pytest.raises(RequestError, match="needs a name"):
        parse_pod(p)


def test_shape_ignores_names() -> None:
    a = parse_pod(pod("a", containers={"x": {rn.GPU: "10"}}))
    b = parse_pod(pod("b", containers={"y": {rn.GPU: "10"}}))
    c = parse_pod(pod("c", containers={"y": {rn.GPU: "20"}}))
    assert a.shape() == b.shape() != c.shape()


# --- PodParser: parse_pod with a memory of recent pod bodies -------------------------------

# few choices, so that bodies repeat, with values that Python takes as equal and the rules
# do not (1, 1.0 and true; 0 and false; a null annotation and none)
LIMITS = st.sampled_from(
    [{rn.GPU: v} for v in ("1", 1, True, 1.0, "100", 100, 100.0, "abc")]
    + [{rn.RDMA: v} for v in (0, False, "0")]
)
SETUPS = st.sampled_from([None, None, None, "Always", 1, True, "Never"])
ANNOTATIONS = st.sampled_from(
    [{}, {}, {}, {rn.RDMA_AFFINITY_ANNOTATION: "numa"}, {rn.RDMA_AFFINITY_ANNOTATION: None}]
    + [{rn.NRI_REQUIRED_PLUGINS_ANNOTATION: v} for v in ("[tessera]", 1, True)]
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    setup = draw(SETUPS)
    init = None if setup is None else {"setup": {rn.GPU: "30"}}
    name = draw(st.sampled_from(["a", "b"]))
    built = pod(name, containers={"main": draw(LIMITS)}, init=init)
    built["metadata"]["annotations"] = draw(ANNOTATIONS)
    if setup is not None and setup != "Never":
        built["spec"]["initContainers"][0]["restartPolicy"] = setup
    return built


@settings(max_examples=300, deadline=None)
@given(st.lists(pods(), min_size=1, max_size=12))
def test_the_parser_answers_as_parse_pod_whatever_it_remembers(batch: list[dict[str, Any]]) -> None:
    # the bodies repeat and differ in type only (100, "100", 100.0, true): a remembered
    # parse must never stand in for a body the rules read differently
    parser = PodParser(nri_plugin="tessera", size=3)
    for raw in batch:
        try:
            expected: PodRequest | str = parse_pod(raw, nri_plugin="tessera")
        except RequestError as exc:
            expected = f"error: {exc}"
        try:
            got: PodRequest | str = parser.parse(raw)
        except RequestError as exc:
            got = f"error: {exc}"
        assert got == expected


def test_a_pod_with_a_remembered_body_is_not_parsed_again() -> None:
    parser = PodParser()
    first = parser.parse(pod("a", containers={"main": {rn.GPU: "30"}}))
    with patch("tessera.request._parse_container", side_effect=AssertionError("parsed")):
        second = parser.parse(pod("b", containers={"main": {rn.GPU: "30"}}))
        assert (second.name, second.uid) == ("b", "uid-b")
        assert second.containers == first.containers
        # a body with a number in it is parsed (and checked) every time
        with pytest.raises(AssertionError, match="parsed"):
            parser.parse(pod("c", containers={"main": {rn.GPU: 30}}))


class Reads(dict[str, Any]):
    """A JSON object that records every key a reader asks for."""

    def __init__(self, log: set[str], where: str, items: dict[str, Any]) -> None:
        super().__init__(items)
        self.log, self.where = log, where

    def get(self, key: str, default: Any = None) -> Any:
        self.log.add(f"{self.where}.{key}")
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.log.add(f"{self.where}.{key}")
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.log.add(f"{self.where}.{key}")
        return super().__contains__(key)


def test_the_parser_remembers_by_everything_parse_pod_reads() -> None:
    # parse_pod must read no field that PodParser's body key leaves out: a new rule that
    # reads another annotation or container field has to join the key (_body_key)
    log: set[str] = set()
    annotations = dict.fromkeys(READ_ANNOTATIONS, "x") | {
        rn.GPU_UUID_ANNOTATION: "GPU-1",
        rn.GPU_UUID_EXCLUDE_ANNOTATION: "GPU-2",
        rn.TOPOLOGY_ANNOTATION: "numa",
        rn.RDMA_AFFINITY_ANNOTATION: "numa",
        rn.PLACEMENT_ANNOTATION: "binpack",
        rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION: "[tessera]",
        rn.NRI_REQUIRED_PLUGINS_ANNOTATION: "[tessera]",
    }
    limits = {rn.GPU: "100", rn.RDMA: "100", "cpu": "1", "memory": "1Gi"}
    resources = Reads(log, "resources", {"limits": limits, "requests": limits})
    container = Reads(log, "container", {"name": "main", "resources": resources})
    sidecar = Reads(log, "container", {"name": "s", "restartPolicy": "Always"})
    spec = Reads(
        log,
        "spec",
        {"containers": [container], "initContainers": [sidecar], "overhead": {"cpu": "1"}},
    )
    meta = Reads(
        log, "metadata", {"name": "p", "uid": "u", "annotations": Reads(log, "ann", annotations)}
    )
    request = parse_pod(Reads(log, "pod", {"metadata": meta, "spec": spec}), nri_plugin="tessera")
    assert request.containers and request.required_plugins == ("tessera",)
    read = {
        "pod.metadata",
        "pod.spec",
        *(f"metadata.{k}" for k in ("annotations", "namespace", "name", "uid")),
        *(f"spec.{k}" for k in ("containers", "initContainers", "overhead")),
        *(f"container.{k}" for k in ("name", "resources", "restartPolicy")),
        *(f"ann.{k}" for k in READ_ANNOTATIONS),
    }
    assert {k for k in log if not k.startswith("resources.")} <= read
    assert {f"ann.{k}" for k in rn.HINT_ANNOTATIONS} <= log  # the reads were seen
