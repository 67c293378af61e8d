"""NRI's required-plugins annotation: reading a tenant's value, merging tessera's hook
into it, and writing it back so that NRI reads the same names."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tessera import resources as rn
from tessera.errors import RequestError
from tessera.nri_required import (
    MAX_PLUGINS,
    MAX_VALUE_CHARS,
    parse_names,
    render,
    required_plugins,
    valid_plugin_name,
)
from tessera.request import parse_pod

POD_KEY = rn.NRI_REQUIRED_PLUGINS_POD_ANNOTATION
BARE_KEY = rn.NRI_REQUIRED_PLUGINS_ANNOTATION

plugin_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_.+-", min_size=1, max_size=20
)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("", ()),
        ("  ", ()),
        ("[]", ()),
        ("[tessera]", ("tessera",)),
        ("[ a , 'b', \"c\" ]", ("a", "b", "c")),
        ("[a, b,]", ("a", "b")),
        ("- a\n-  'b'\n\n- \"c\"\n", ("a", "b", "c")),
        ('["tessera", "policy"]', ("tessera", "policy")),
        ("[v1.2+x_y-z]", ("v1.2+x_y-z",)),
    ],
)
def test_the_yaml_lists_nri_reads_are_read(value: str, names: tuple[str, ...]) -> None:
    assert parse_names(value, POD_KEY) == names


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("tessera", "expected a YAML list"),
        ("{a: b}", "expected a YAML list"),
        ("[a", "must end with ']'"),
        ("[a, , b]", "not an NRI plugin name"),
        ("[a b]", "not an NRI plugin name"),
        ("[a/b]", "not an NRI plugin name"),
        ("- a\nb", "expected a YAML list"),
        ("-", "not an NRI plugin name"),
        ("[a] # comment", "must end with ']'"),
        ("[[a]]", "not an NRI plugin name"),
        ("['a\"]", "not an NRI plugin name"),
        ("[" + ",".join(["x"] * (MAX_PLUGINS + 1)) + "]", f"more than {MAX_PLUGINS}"),
        ("[" + "x" * MAX_VALUE_CHARS + "]", f"longer than {MAX_VALUE_CHARS}"),
    ],
)
def test_anything_else_is_a_request_error_naming_the_key(value: str, why: str) -> None:
    with pytest.raises(RequestError, match=POD_KEY) as raised:
        parse_names(value, POD_KEY)
    assert why in str(raised.value)


def test_a_value_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(RequestError, match="must be strings"):
        parse_names(["tessera"], BARE_KEY)


def test_tessera_comes_first_and_the_pods_own_names_follow_once() -> None:
    assert required_plugins({}, "tessera") == ("tessera",)
    assert required_plugins({POD_KEY: "[a, tessera, a]"}, "tessera") == ("tessera", "a")
    # containerd reads the /pod key before the bare one: so does the merge
    both = {POD_KEY: "[a]", BARE_KEY: "[b]"}
    assert required_plugins(both, "tessera") == ("tessera", "a")
    assert required_plugins({BARE_KEY: "- b"}, "tessera") == ("tessera", "b")
    # container-scope keys are the tenant's to set and are not read
    container_key = f"{BARE_KEY}/container.main"
    assert required_plugins({container_key: "{not a list"}, "tessera") == ("tessera",)
    with pytest.raises(ValueError, match="not an NRI plugin name"):
        required_plugins({}, "two words")


def test_only_pods_that_want_devices_carry_a_requirement() -> None:
    def pod(limits: dict[str, str], annotations: dict[str, str]) -> dict[str, object]:
        return {
            "metadata": {"name": "p", "uid": "u", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        }

    gpu = {rn.GPU: "50"}
    assert parse_pod(pod(gpu, {}), nri_plugin="tessera").required_plugins == ("tessera",)
    assert parse_pod(pod(gpu, {}), nri_plugin=None).required_plugins == ()
    assert parse_pod(pod({}, {POD_KEY: "{x"}), nri_plugin="tessera").required_plugins == ()
    with pytest.raises(RequestError, match=POD_KEY):
        parse_pod(pod(gpu, {POD_KEY: "{x"}), nri_plugin="tessera")
    assert parse_pod(pod(gpu, {POD_KEY: "{x"}), nri_plugin=None).required_plugins == ()


@given(st.lists(plugin_names, max_size=MAX_PLUGINS))
def test_what_is_written_reads_back_the_same_here_and_in_yaml(names: list[str]) -> None:
    text = render(tuple(names))
    assert parse_names(text, POD_KEY) == tuple(names)
    assert yaml.safe_load(text) == names  # every name quoted: none reads as a number or null


@given(
    st.lists(plugin_names, max_size=8),
    st.sampled_from(["flow", "block"]),
    st.sampled_from(["", "'", '"']),
)
def test_lists_read_as_a_yaml_parser_reads_them(names: list[str], form: str, quote: str) -> None:
    items = [f"{quote}{n}{quote}" for n in names]
    text = "[" + ", ".join(items) + "]" if form == "flow" else "".join(f"- {i}\n" for i in items)
    loaded = yaml.safe_load(text) or []
    if all(isinstance(x, str) for x in loaded):  # plain `1` or `true` are no strings in YAML
        assert parse_names(text, POD_KEY) == tuple(loaded)


@given(st.text(max_size=200))
def test_any_text_gives_valid_names_or_a_request_error(text: str) -> None:
    try:
        names = parse_names(text, POD_KEY)
    except RequestError:
        return
    assert len(names) <= MAX_PLUGINS and all(valid_plugin_name(n) for n in names)
