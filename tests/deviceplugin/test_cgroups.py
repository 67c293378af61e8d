"""Which Kubernetes container a process is in, from its /proc/<pid>/cgroup text, as the
kubelet and the runtimes lay cgroups out: both cgroup drivers, both cgroup versions, the
three QoS classes, containerd, CRI-O and Docker, a kubelet nested under another cgroup and
cgroups made below a container; and everything that is not a container."""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.cgroups import MAX_CGROUP_TEXT, ContainerRef, container_of, runtime_container_id

UID = "2cde702b-a0cf-438d-a228-fb164e54434b"
CID = "0765f197c9158576f202e50498b488cd0d2b022fb2462b0a629f214bb51cd57d"
NODE_CID = "d5d9ee5cf5ec9520d182418b737fb11f3aa6b739e91d7cb6ecd6786f6a2bcbd1"
REF = ContainerRef(UID, CID)
ESCAPED = UID.replace("-", "_")

QOS = ("guaranteed", "burstable", "besteffort")
RUNTIMES = ("containerd", "crio", "docker")
V1_CONTROLLERS = (
    "hugetlb",
    "cpuset",
    "freezer",
    "perf_event",
    "memory",
    "net_cls,net_prio",
    "blkio",
    "pids",
    "devices",
    "cpu,cpuacct",
)
"""The cgroup v1 hierarchies the kubelet manages, in the kernel's order (highest id first)."""


def systemd_path(qos: str, uid: str, runtime: str, cid: str) -> str:
    """The kubelet's systemd driver: nested slices, the UID's dashes as underscores."""
    scope = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}[runtime]
    escaped = uid.replace("-", "_")
    if qos == "guaranteed":
        return f"/kubepods.slice/kubepods-pod{escaped}.slice/{scope}-{cid}.scope"
    return (
        f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice/"
        f"{scope}-{cid}.scope"
    )


def cgroupfs_path(qos: str, uid: str, runtime: str, cid: str) -> str:
    """The cgroupfs driver: plain directories; CRI-O names its container `crio-<id>`."""
    leaf = f"crio-{cid}" if runtime == "crio" else cid
    tier = "" if qos == "guaranteed" else f"/{qos}"
    return f"/kubepods{tier}/pod{uid}/{leaf}"


def v2(path: str) -> str:
    return f"0::{path}\n"


def v1(path: str, *, systemd_line: str | None = None, hybrid: bool = False) -> str:
    """A cgroup v1 file: one line per hierarchy, the kubelet's holding the path, rdma and
    misc (which the kubelet leaves alone) at the root, and the named systemd hierarchy."""
    lines = [f"{14 - i}:{c}:{path}" for i, c in enumerate(V1_CONTROLLERS)]
    lines += ["3:rdma:/", "2:misc:/", f"1:name=systemd:{systemd_line or path}"]
    if hybrid:
        lines.append("0::/")
    return "\n".join(lines) + "\n"


def kubelet_path(driver: str, qos: str, uid: str, runtime: str, cid: str) -> str:
    return (systemd_path if driver == "systemd" else cgroupfs_path)(qos, uid, runtime, cid)


LAYOUTS = [
    pytest.param(v2(systemd_path(q, UID, r, CID)), id=f"v2-systemd-{q}-{r}")
    for q in QOS
    for r in RUNTIMES
] + [
    pytest.param(v2(cgroupfs_path(q, UID, r, CID)), id=f"v2-cgroupfs-{q}-{r}")
    for q in QOS
    for r in RUNTIMES
]
LAYOUTS += [
    pytest.param(v1(systemd_path(q, UID, r, CID)), id=f"v1-systemd-{q}-{r}")
    for q in QOS
    for r in RUNTIMES
]
LAYOUTS += [
    pytest.param(v1(cgroupfs_path(q, UID, r, CID), hybrid=True), id=f"v1-cgroupfs-{q}-{r}")
    for q in QOS
    for r in RUNTIMES
]


@pytest.mark.parametrize("text", LAYOUTS)
def test_every_driver_version_qos_class_and_runtime(text: str) -> None:
    assert container_of(text) == REF


@pytest.mark.parametrize(
    "text",
    [
        # a kind or minikube node: the node is itself a container, seen from the host
        v2(f"/system.slice/docker-{NODE_CID}.scope" + systemd_path("burstable", UID, "crio", CID)),
        v2(f"/docker/{NODE_CID}" + cgroupfs_path("besteffort", UID, "containerd", CID)),
        # a kubelet with cgroupfs and --cgroup-root=/kubelet
        v2("/kubelet" + cgroupfs_path("burstable", UID, "containerd", CID)),
        # seen from the agent's own cgroup namespace: a path relative to the agent's cgroup
        v2(
            f"/../../kubepods-besteffort.slice/kubepods-besteffort-pod{ESCAPED}.slice/crio-{CID}.scope"
        ),
        v2("/../.." + systemd_path("guaranteed", UID, "containerd", CID)),
    ],
)
def test_a_kubelet_nested_under_another_cgroup(text: str) -> None:
    assert container_of(text) == REF


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_kubelet_in_a_systemd_slice_as_kind_runs_it(qos: str, version: str) -> None:
    pod = (
        f"kubelet-kubepods-pod{ESCAPED}.slice"
        if qos == "guaranteed"
        else f"kubelet-kubepods-{qos}.slice/kubelet-kubepods-{qos}-pod{ESCAPED}.slice"
    )
    path = f"/kubelet.slice/kubelet-kubepods.slice/{pod}/cri-containerd-{CID}.scope"
    assert container_of(v2(path) if version == "v2" else v1(path)) == REF


@pytest.mark.parametrize(
    "below",
    ["/init.scope", "/container", "/a/b/c", f"/{'f' * 64}", f"/kubepods/pod{uuid.UUID(int=9)}"],
)
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_a_cgroup_made_below_the_container_is_still_that_container(below: str, driver: str) -> None:
    path = kubelet_path(driver, "burstable", UID, "containerd", CID) + below
    assert container_of(v2(path)) == REF
    assert container_of(v1(path)) == REF


def test_the_first_pod_segment_decides() -> None:
    inner = cgroupfs_path("burstable", str(uuid.UUID(int=7)), "containerd", "e" * 64)
    outer = cgroupfs_path("burstable", UID, "containerd", CID)
    assert container_of(v2(outer + inner)) == REF
    # a first pod segment without a container after it: not a container, whatever follows
    assert container_of(v2(f"/kubepods/pod{UID}/sub" + inner)) is None


def test_lines_are_read_until_one_names_a_container() -> None:
    pod_only = f"/kubepods/burstable/pod{UID}"
    container = cgroupfs_path("burstable", UID, "crio", CID)
    lines = ["12:rdma:/", f"11:hugetlb:{pod_only}", "10:misc:/user.slice"]
    lines += [f"{9 - i}:{c}:{container}" for i, c in enumerate(V1_CONTROLLERS[:4])]
    text = "\n".join(lines)
    assert container_of(text) == REF


def test_the_pod_uid_is_given_as_the_api_server_writes_it() -> None:
    upper = UID.upper()
    assert container_of(v2(cgroupfs_path("besteffort", upper, "containerd", CID))) == REF
    mixed = UID[:8] + "_" + UID[9:]
    assert container_of(v2(cgroupfs_path("besteffort", mixed, "containerd", CID))) == REF


def test_the_sandbox_is_a_container_like_any_other() -> None:
    """The pause process runs in the sandbox's own container cgroup: its ID is no container
    of the pod's status, which attribution handles; the parser only reads the cgroup."""
    sandbox = "6cfac3ddc07ee5dbbc6944d4deb61ad2778fb8a6c102ea23b46c464b3d1d83cb"
    text = v2(systemd_path("besteffort", UID, "crio", sandbox))
    assert container_of(text) == ContainerRef(UID, sandbox)


# -- not a container -----------------------------------------------------------------------

POD_SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESCAPED}.slice"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("\n\n", id="blank lines"),
        pytest.param(v2("/"), id="v2 root"),
        pytest.param(v2("/init.scope"), id="init"),
        pytest.param(v2("/user.slice/user-1000.slice/session-3.scope"), id="login session"),
        pytest.param(v2("/system.slice/containerd.service"), id="containerd"),
        pytest.param(v2("/system.slice/kubelet.service"), id="kubelet"),
        pytest.param(v2(f"/system.slice/docker-{CID}.scope"), id="docker outside k8s"),
        pytest.param(v2(f"/docker/{CID}"), id="docker cgroupfs outside k8s"),
        pytest.param(v1("/system.slice/nvidia-persistenced.service"), id="v1 service"),
        pytest.param(v1("/", hybrid=True), id="v1 root"),
        pytest.param(v2("/kubepods.slice"), id="kubepods slice"),
        pytest.param(v2("/kubepods.slice/kubepods-besteffort.slice"), id="qos slice"),
        pytest.param(v2("/kubepods/burstable"), id="qos cgroupfs"),
        pytest.param(v2(POD_SLICE), id="pod slice"),
        pytest.param(v1(f"/kubepods/pod{UID}"), id="pod cgroupfs v1"),
        pytest.param(v2(f"{POD_SLICE}/crio-conmon-{CID}.scope"), id="conmon"),
        pytest.param(v1(f"/kubepods/besteffort/pod{UID}/crio-conmon-{CID}"), id="conmon v1"),
    ],
)
def test_processes_outside_any_container(text: str) -> None:
    assert container_of(text) is None


@pytest.mark.parametrize(
    "pod",
    [
        f"pod{UID[:-1]}",  # a digit short
        f"pod{UID}0",  # a digit long
        f"pod{UID.replace('a', 'g', 1)}",  # not hex
        f"pod{UID.replace('-', '.')}",
        f"pod-{UID}",
        f"pods{UID}",
        f"{UID}",
        f"kubepods-burstable-pod{UID}.scope",
        f"kubepods-burstable-pod{UID}.slice.slice",
        "pod",
    ],
)
def test_a_malformed_pod_segment_is_no_pod(pod: str) -> None:
    # a parent prefix is any slice name (the systemd driver names slices after their
    # parents), and 32 hex digits without separators are a static pod's config hash
    assert container_of(v2(f"/kubepods/burstable/{pod}/{CID}")) is None
    assert container_of(v2(f"/kubepods/burstable/{pod}/cri-containerd-{CID}.scope")) is None


@pytest.mark.parametrize(
    "leaf",
    [
        CID[:-1],
        CID + "0",
        CID.upper(),
        CID[:-1] + "g",
        f"cri-containerd-{CID[:-1]}.scope",
        f"cri-containerd-{CID}0.scope",
        f"containerd-{CID}.scope",
        f"cri-o-{CID}.scope",
        f"crio-conmon-{CID}.scope",
        f"{CID}.slice",
        f"docker-{CID}.scope.scope",
        f"-{CID}",
        "",
    ],
)
def test_an_id_that_is_not_64_hex_digits_is_no_container(leaf: str) -> None:
    assert container_of(v2(f"{POD_SLICE}/{leaf}")) is None
    assert container_of(v1(f"/kubepods/pod{UID}/{leaf}")) is None


@pytest.mark.parametrize(
    "text",
    [
        f"{POD_SLICE}/cri-containerd-{CID}.scope",  # no hierarchy fields
        f"0:{POD_SLICE}/cri-containerd-{CID}.scope",  # one colon short
    ],
)
def test_a_line_without_its_two_fields_names_no_path(text: str) -> None:
    assert container_of(text) is None


# -- the size bound ------------------------------------------------------------------------


def test_text_at_the_size_limit_is_read_and_longer_text_is_not() -> None:
    line = v2(systemd_path("burstable", UID, "containerd", CID))
    exact = "\n" * (MAX_CGROUP_TEXT - len(line)) + line
    assert len(exact) == MAX_CGROUP_TEXT
    assert container_of(exact) == REF
    assert container_of("\n" + exact) is None
    assert container_of(exact + "0::/\n") is None


# -- runtime_container_id ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status_id", "expected"),
    [
        (f"containerd://{CID}", CID),
        (f"cri-o://{CID}", CID),
        (f"docker://{CID}", CID),
        (CID, CID),
        ("", ""),
        ("containerd://", ""),
    ],
)
def test_runtime_container_id_drops_the_runtime(status_id: str, expected: str) -> None:
    assert runtime_container_id(status_id) == expected


def test_a_status_id_matches_the_parsed_cgroup() -> None:
    ref = container_of(v2(systemd_path("burstable", UID, "crio", CID)))
    assert ref is not None
    assert ref.container_id == runtime_container_id(f"cri-o://{CID}")


# -- properties ----------------------------------------------------------------------------

container_ids = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
prefixes = st.sampled_from(
    ["", f"/system.slice/docker-{NODE_CID}.scope", f"/docker/{NODE_CID}", "/../..", "/.."]
)
cgroupfs_roots = st.sampled_from(["", "/kubelet", "/custom/root"])
"""--cgroup-root under the cgroupfs driver (the systemd driver's: the kind test above)."""
belows = st.sampled_from(["", "/init.scope", "/container", "/x/y"])


@settings(max_examples=400, deadline=None)
@given(
    st.uuids(),
    container_ids,
    st.sampled_from(["systemd", "cgroupfs"]),
    st.sampled_from(QOS),
    st.sampled_from(RUNTIMES),
    st.sampled_from(["v1", "v1-hybrid", "v2"]),
    prefixes,
    cgroupfs_roots,
    belows,
)
def test_every_supported_layout_gives_back_its_pod_and_container(
    pod_uid: uuid.UUID,
    cid: str,
    driver: str,
    qos: str,
    runtime: str,
    version: str,
    prefix: str,
    cgroupfs_root: str,
    below: str,
) -> None:
    root = cgroupfs_root if driver == "cgroupfs" else ""
    path = prefix + root + kubelet_path(driver, qos, str(pod_uid), runtime, cid) + below
    text = v2(path) if version == "v2" else v1(path, hybrid=version == "v1-hybrid")
    assert container_of(text) == ContainerRef(str(pod_uid), cid)


UUID_FORM = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check(text: str) -> None:
    ref = container_of(text)
    if ref is not None:
        assert UUID_FORM.fullmatch(ref.pod_uid)
        assert re.fullmatch(r"[0-9a-f]{64}", ref.container_id)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_never_raises(text: str) -> None:
    check(text)


segments = st.sampled_from(
    [
        "kubepods",
        "kubepods.slice",
        "kubepods-burstable.slice",
        f"kubepods-burstable-pod{ESCAPED}.slice",
        f"pod{UID}",
        f"pod{UID.upper()}",
        CID,
        f"cri-containerd-{CID}.scope",
        f"crio-conmon-{CID}.scope",
        "..",
        "",
        ":",
        "0::",
        "\n",
        "\r",
        "x",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(segments, st.sampled_from(["/", "", ":", "\n"])), max_size=12))
def test_cgroup_like_text_never_raises(parts: list[tuple[str, str]]) -> None:
    check("".join(a + b for a, b in parts))


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=200), st.integers(1, 3 * MAX_CGROUP_TEXT))
def test_text_over_the_limit_is_none(text: str, extra: int) -> None:
    valid = v2(systemd_path("burstable", UID, "containerd", CID))
    big = valid + (text * (MAX_CGROUP_TEXT // len(text) + 1))[: MAX_CGROUP_TEXT - len(valid)]
    big += "\n" * (MAX_CGROUP_TEXT - len(big)) + "x" * extra
    assert len(big) > MAX_CGROUP_TEXT
    assert container_of(big) is None


def test_a_static_pods_config_hash_names_its_pod() -> None:
    digest = UID.replace("-", "")
    ref = container_of(v2(f"/kubepods/besteffort/pod{digest}/{CID}"))
    assert ref is not None and (ref.pod_uid, ref.container_id) == (digest, CID)


def test_cgroups_a_container_makes_below_its_own_cannot_name_another_pod() -> None:
    """A container may make cgroups below its own and name them as it likes: the pod and
    container the kubelet and runtime named, further out, are the ones that count."""
    other = "11111111-2222-4333-8444-555555555555"
    nested = f"/kubepods-pod{other.replace('-', '_')}.slice/cri-containerd-{'f' * 64}.scope"
    ref = container_of(v2(f"/kubepods/burstable/pod{UID}/{CID}{nested}"))
    assert ref is not None and (ref.pod_uid, ref.container_id) == (UID, CID)
