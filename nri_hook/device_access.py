"""Which of the node's GPUs a container's own device-cgroup rules already open.

GPU isolation rests on the device cgroup: a container reaches only the device nodes its
rules allow, and the plugin adds rules for the GPUs the scheduler gave it. A container
whose spec already allows GPU devices reaches GPUs nobody gave it: a privileged container
(containerd allows every device to it), or one given a rule for the NVIDIA major by some
other means. The plugin cannot take such access away; it says so, per container, so that
an operator sees it (on a real GPU, the CUDA library even creates a device node that is
missing, so hiding the node is no defence).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from protos.nri import api_pb2 as api

NVIDIA_GPU_MAJOR: Final = 195
"""The character-device major of /dev/nvidia<minor> (and /dev/nvidiactl, minor 255)."""


ANY_GPU: Final = -1
"""Stands for a GPU whose minor is not known: only a rule for every minor opens it."""


def _matches(rule: api.LinuxDeviceCgroup, minor: int) -> bool:
    if rule.type not in ("", "a", "c"):
        return False  # a block-device rule
    if rule.HasField("major") and rule.major.value != NVIDIA_GPU_MAJOR:
        return False
    return not (rule.HasField("minor") and rule.minor.value != minor)


def _opens(rule: api.LinuxDeviceCgroup) -> bool:
    """Whether the rule is about reading or writing (mknod alone opens nothing); an empty
    access string means all of read, write and mknod."""
    return not rule.access or "r" in rule.access or "w" in rule.access


def open_gpus(rules: Sequence[api.LinuxDeviceCgroup], minors: Iterable[int]) -> list[int]:
    """The GPU minors among `minors` that `rules` let the container read or write.

    The runtime's rule order: the last rule that matches a device decides, and a device
    no rule matches is denied (runc's device filter checks the rules from the last one
    back and takes the first match; containerd puts its deny-all rule first)."""
    opened = []
    for minor in minors:
        allowed = False
        for rule in rules:
            if _opens(rule) and _matches(rule, minor):
                allowed = rule.allow
        if allowed:
            opened.append(minor)
    return opened


def named_minors(rules: Sequence[api.LinuxDeviceCgroup]) -> set[int]:
    """GPU minors that rules for the NVIDIA major name one by one."""
    return {
        rule.minor.value
        for rule in rules
        if rule.HasField("major")
        and rule.major.value == NVIDIA_GPU_MAJOR
        and rule.HasField("minor")
        and 0 <= rule.minor.value < 255  # 255 is nvidiactl, not a GPU
    }
