"""Reading gangs from objects any tenant writes: PodGroups, pod labels and annotations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.errors import GangError, InputError
from tessera.gang.spec import (
    MAX_MIN_MEMBER,
    GangKey,
    GangSpec,
    GangTopology,
    PodGroupSource,
    gang_key_of,
    is_label_key,
    topology_of,
)

SOURCE = PodGroupSource()


def group(spec: Any, name: str = "llama", namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def member(labels: Any = None, annotations: Any = None, namespace: Any = "ml") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "labels": labels, "annotations": annotations}}


def test_a_podgroup_reads_as_its_spec() -> None:
    spec = SOURCE.parse(group({"minMember": 8, "scheduleTimeoutSeconds": 120}))
    assert spec == GangSpec(GangKey("ml", "llama"), 8, 120)


def test_defaults_min_member_one_and_the_default_timeout() -> None:
    spec = SOURCE.parse(group({}))
    assert (spec.min_member, spec.timeout_seconds) == (1, rn.DEFAULT_GANG_TIMEOUT_SECONDS)
    assert PodGroupSource(default_timeout=7).parse(group({})).timeout_seconds == 7


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (None, "spec is missing"),
        ([], "spec is missing"),
        ({"minMember": "8"}, "minMember must be an integer"),
        ({"minMember": True}, "minMember must be an integer"),
        ({"minMember": 0}, "minMember must be between"),
        ({"minMember": MAX_MIN_MEMBER + 1}, "minMember must be between"),
        ({"minMember": 2**70}, "minMember must be between"),
        ({"minMember": 2, "scheduleTimeoutSeconds": -1}, "scheduleTimeoutSeconds"),
        ({"minMember": 2, "scheduleTimeoutSeconds": 1.5}, "scheduleTimeoutSeconds"),
    ],
)
def test_a_bad_podgroup_is_a_typed_error_naming_the_field(spec: Any, field: str) -> None:
    with pytest.raises(GangError, match=field) as caught:
        SOURCE.parse(group(spec))
    assert isinstance(caught.value, InputError)
    assert "ml/llama" in str(caught.value)


@pytest.mark.parametrize("name", ["", "UPPER", "a" * 254, "x/y", None, 7])
def test_a_podgroup_without_a_usable_name_is_refused(name: Any) -> None:
    with pytest.raises(GangError):
        SOURCE.parse(group({}, name=name))
    assert SOURCE.key(group({}, name=name)) is None


def test_the_pod_group_label_names_the_gang_in_the_pods_namespace() -> None:
    assert gang_key_of(member({rn.POD_GROUP_LABEL: "llama"})) == GangKey("ml", "llama")
    assert gang_key_of(member({"app": "x"})) is None
    assert gang_key_of(member(None)) is None
    assert gang_key_of({"metadata": "junk"}) is None


@pytest.mark.parametrize("value", ["", "Bad_Name", "-x", "a" * 64, 5, ["x"], "a b"])
def test_a_label_that_cannot_name_a_podgroup_is_a_gang_error(value: Any) -> None:
    with pytest.raises(GangError, match=rn.POD_GROUP_LABEL):
        gang_key_of(member({rn.POD_GROUP_LABEL: value}))


def test_a_member_needs_a_namespace() -> None:
    with pytest.raises(GangError, match="namespace"):
        gang_key_of(member({rn.POD_GROUP_LABEL: "x"}, namespace=None))


def test_topology_annotations() -> None:
    pod = member(
        annotations={
            rn.GANG_REQUIRED_TOPOLOGY_ANNOTATION: "topology.kubernetes.io/rack",
            rn.GANG_PREFERRED_TOPOLOGY_ANNOTATION: " block ",
        }
    )
    assert topology_of(pod) == GangTopology("topology.kubernetes.io/rack", "block")
    assert topology_of(member()) == GangTopology()


@pytest.mark.parametrize("value", ["", "a/b/c", "-rack", "UPPER.example/x", "x" * 64, 3, "/x"])
def test_a_topology_that_is_no_label_key_is_a_gang_error(value: Any) -> None:
    pod = member(annotations={rn.GANG_REQUIRED_TOPOLOGY_ANNOTATION: value})
    with pytest.raises(GangError, match="not a node label key"):
        topology_of(pod)


@given(st.text(max_size=400))
def test_label_key_check_never_raises_and_bounds_length(text: str) -> None:
    if is_label_key(text):
        assert len(text) <= 317
        assert "/" not in text.rpartition("/")[2]


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=20,
    )
)
def test_any_spec_parses_or_is_a_gang_error(spec: Any) -> None:
    for obj in (group(spec), {"metadata": spec, "spec": spec}, spec):
        try:
            parsed = SOURCE.parse(obj)
        except GangError:
            continue
        assert 1 <= parsed.min_member <= MAX_MIN_MEMBER
