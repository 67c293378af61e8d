"""Which GPUs a container's own device-cgroup rules open (nri_hook.device_access)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nri_hook.device_access import ANY_GPU, NVIDIA_GPU_MAJOR, named_minors, open_gpus
from protos.nri import api_pb2 as api

GPUS = [0, 1, 2, 3]


def rule(
    allow: bool,
    kind: str = "",
    major: int | None = None,
    minor: int | None = None,
    access: str = "rwm",
) -> api.LinuxDeviceCgroup:
    out = api.LinuxDeviceCgroup(allow=allow, type=kind, access=access)
    if major is not None:
        out.major.value = major
    if minor is not None:
        out.minor.value = minor
    return out


DENY_ALL = rule(False)  # what containerd sends for every container before its defaults
PRIVILEGED = rule(True)  # containerd's WithAllDevicesAllowed


def test_what_containerd_sends() -> None:
    assert open_gpus([DENY_ALL], GPUS) == []
    assert open_gpus([PRIVILEGED], GPUS) == GPUS
    assert open_gpus([PRIVILEGED], [ANY_GPU]) == [ANY_GPU]
    assert open_gpus([], GPUS) == []  # no rule matches: denied


def test_rules_for_the_nvidia_major() -> None:
    every_gpu = rule(True, "c", NVIDIA_GPU_MAJOR, access="rw")
    assert open_gpus([DENY_ALL, every_gpu], GPUS) == GPUS
    one = rule(True, "c", NVIDIA_GPU_MAJOR, 2, "rw")
    assert open_gpus([DENY_ALL, one], [*GPUS, ANY_GPU]) == [2]
    # the last matching rule decides
    assert open_gpus([DENY_ALL, every_gpu, rule(False, "c", NVIDIA_GPU_MAJOR, 1)], GPUS) == [
        0,
        2,
        3,
    ]
    assert open_gpus([PRIVILEGED, DENY_ALL], GPUS) == []


def test_rules_that_open_no_gpu() -> None:
    assert open_gpus([DENY_ALL, rule(True, "b")], GPUS) == []  # block devices
    assert open_gpus([DENY_ALL, rule(True, "c", 1, 3)], GPUS) == []  # /dev/null
    assert open_gpus([DENY_ALL, rule(True, "c", NVIDIA_GPU_MAJOR, access="m")], GPUS) == []
    assert open_gpus([DENY_ALL, rule(True, "c", NVIDIA_GPU_MAJOR, 255, "rw")], GPUS) == []


def test_minors_named_one_by_one() -> None:
    rules = [DENY_ALL, rule(True, "c", NVIDIA_GPU_MAJOR, 5), rule(True, "c", NVIDIA_GPU_MAJOR, 255)]
    assert named_minors([*rules, rule(True, "c", 1, 7), rule(True, "c", NVIDIA_GPU_MAJOR)]) == {5}


rules_strategy = st.lists(
    st.builds(
        rule,
        st.booleans(),
        st.sampled_from(["", "a", "c", "b"]),
        st.one_of(st.none(), st.sampled_from([NVIDIA_GPU_MAJOR, 1, 10])),
        st.one_of(st.none(), st.sampled_from([*GPUS, 255])),
        st.sampled_from(["rwm", "r", "w", "m", ""]),
    ),
    max_size=6,
)


@given(rules_strategy, st.sampled_from(GPUS))
def test_a_final_rule_decides_for_what_it_matches(
    rules: list[api.LinuxDeviceCgroup], gpu: int
) -> None:
    assert open_gpus([*rules, DENY_ALL], GPUS) == []
    assert open_gpus([*rules, PRIVILEGED], GPUS) == GPUS
    assert gpu in open_gpus([*rules, rule(True, "c", NVIDIA_GPU_MAJOR, gpu, "rw")], GPUS)
    assert gpu not in open_gpus([*rules, rule(False, "a", NVIDIA_GPU_MAJOR, gpu)], GPUS)
    # each GPU is judged on its own: asking about one gives that GPU's answer
    whole = open_gpus(rules, GPUS)
    assert [g for g in GPUS if open_gpus(rules, [g])] == whole
