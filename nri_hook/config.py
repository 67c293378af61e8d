"""tessera-nri-hook's settings: each field declares its flag (tessera_cli.flags)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Final

from nri_hook.enforce import OnInvalid
from nri_hook.netdev import IFNAMSIZ
from nri_hook.plugin import (
    DEFAULT_REGISTRATION_TIMEOUT,
    DEFAULT_SOCKET_PATH,
    PLUGIN_IDX_ENV,
    PLUGIN_NAME_ENV,
    PLUGIN_SOCKET_ENV,
)
from tessera.resources import DEFAULT_INTEGRITY_KEY_FILE, DEFAULT_NRI_PLUGIN_NAME
from tessera_cli.flags import FlagGroup
from tessera_cli.values import whole
from tessera_edge.node_cli import (
    LOGS_AND_METRICS,
    isolation_flag,
    mps_pipe_dir_flag,
    node_name_flag,
)

DEFAULT_PLUGIN_INDEX = "50"
MAX_REGISTRATION_TIMEOUT: Final = 3600.0
"""Seconds; containerd's own registration timeout is 5 s, so anything near an hour is a typo."""
_IFNAME_RE: Final = re.compile(r"^[A-Za-z0-9_.-]*$")

_CONNECTION = FlagGroup("connection to the runtime")
_RECORDS = FlagGroup("allocation records")
_DEVICES = FlagGroup("devices")
_VF_NETDEVS = FlagGroup("RDMA VF network devices")
_OUTPUT = LOGS_AND_METRICS


MAX_UID: Final = 2**32 - 2
"""Linux uids are 32 bits; (uid_t)-1 means "no user"."""


def _client_user(text: str) -> int | None:
    """A uid, or 'any' (None): the user MPS serves."""
    if text.strip().lower() == "any":
        return None
    try:
        return whole(0, MAX_UID)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; want a uid or 'any'") from None


_client_user.__name__ = "uid"


def _vf_prefix(text: str) -> str:
    """A prefix for interface names: PREFIX and a two-digit index fit in IFNAMSIZ."""
    if len(text) + 2 >= IFNAMSIZ:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is too long for an interface name (at most {IFNAMSIZ - 3} characters)"
        )
    if not _IFNAME_RE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: use only letters, digits, '_', '.' and '-'")
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class NriHookConfig:
    socket: str = _CONNECTION.path(
        "NRI socket of containerd to dial (default: %(default)s). Not used when containerd "
        f"launched the plugin ({PLUGIN_SOCKET_ENV} set).",
        DEFAULT_SOCKET_PATH,
    )
    plugin_name: str = _CONNECTION.flag(
        "name to register under; letters, digits, _ . + - (default: %(default)s). "
        f"{PLUGIN_NAME_ENV} from a launching runtime takes precedence.",
        default=DEFAULT_NRI_PLUGIN_NAME,
        metavar="NAME",
    )
    plugin_index: str = _CONNECTION.flag(
        "two-digit index; containerd calls plugins in ascending index order (default: "
        f"%(default)s). {PLUGIN_IDX_ENV} from a launching runtime takes precedence.",
        default=DEFAULT_PLUGIN_INDEX,
        metavar="NN",
    )
    registration_timeout: float = _CONNECTION.duration(
        "how long to wait for the runtime to accept the registration (default: %(default)s)",
        default=DEFAULT_REGISTRATION_TIMEOUT,
        high=MAX_REGISTRATION_TIMEOUT,
    )

    node_name: str = node_name_flag(_RECORDS, "a record for another node is refused")
    integrity_key_file: str = _RECORDS.path(
        "PEM public key file, or directory of them (the Secret tessera-record-verify), that "
        "verify the scheduler's Ed25519 record signatures; private keys are refused. Re-read "
        "when the files change (checked every 10 s), so rotation needs no restart (default: "
        "%(default)s)",
        DEFAULT_INTEGRITY_KEY_FILE,
    )
    no_integrity: bool = _RECORDS.switch(
        "accept records without checking their integrity proof. Anyone who can create a pod "
        "can then claim any device: for test clusters only"
    )
    on_invalid_record: OnInvalid = _RECORDS.choice(  # noqa: RUF009 -- a field, not a value
        "what to do with a malformed or forged record, or one naming a device this node "
        "lacks: fail the container creation (and a sandbox start that must move VFs) with an "
        "error saying what is wrong, or log a warning and leave the container untouched "
        "(default: %(default)s)",
        ("fail", "warn"),
        "fail",
    )

    device_root: str = _DEVICES.directory(
        "where the host's /dev, /sys and /proc/driver/nvidia are visible; device type, major, "
        "minor and mode are read from <DIR>/dev/... (default: %(default)s; /host in the "
        "DaemonSet)",
        "/",
    )
    isolation: str | None = isolation_flag(
        _DEVICES,
        "The hook sets the layer's variables in each container given part of a GPU and "
        "mounts the library's region (a tmpfs) or the pipe directory; none only gives the "
        "devices and needs --allow-unisolated-sharing (default: none chosen, and the hook "
        "refuses to start).",
    )
    allow_unisolated_sharing: bool = _DEVICES.switch(
        "with --isolation=none: accept that pods sharing a GPU are not limited in memory or "
        "compute (each such container is logged as a warning and counted in "
        "tessera_nri_unisolated_gpu_shares_total)"
    )
    mps_pipe_dir: str = mps_pipe_dir_flag(_DEVICES)
    mps_client_user: int | None = _DEVICES.flag(
        "with --isolation=mps: the Linux user whose containers MPS serves, a uid or 'any' "
        "(the daemon in multi-user mode, tessera-isolation mps --multi-user). MPS serves one "
        "user at a time and a client of another user waits, silently, for the running "
        "clients to end: a container given part of a GPU that runs as another uid (or in "
        "a user namespace of its own) is refused saying so; one given whole GPUs runs "
        "without MPS. Needs the runtime to tell the container's user (NRI API 0.11 and "
        "later); otherwise it is not checked. Default: %(default)s.",
        type=_client_user,
        default=0,
        metavar="UID|any",
    )
    hami_core_library: str = _DEVICES.path(
        "host path of HAMi-core's libvgpu.so to mount read-only and set as LD_PRELOAD (with "
        "--isolation=hami-core; default: none, the node or image provides it)",
        "",
        absolute=True,
    )

    no_vf_netdevs: bool = _VF_NETDEVS.switch(
        "do not move allocated VF netdevs into pod network namespaces"
    )
    vf_rename_prefix: str = _VF_NETDEVS.flag(
        "inside the pod, name the VFs PREFIX0, PREFIX1, ... in record order (default: keep "
        "the host name)",
        type=_vf_prefix,
        default="",
        metavar="PREFIX",
    )

    log_file: str = _OUTPUT.path(
        "append logs to this file (default: stderr; a plugin launched by containerd has its "
        "stderr sent to /dev/null, so give it a file)",
        "",
    )
    # the flags every node program shares (tessera_edge.logs, tessera_cli.metrics)
    log_format: str
    log_level: str
    metrics_port: int
    metrics_address: str
