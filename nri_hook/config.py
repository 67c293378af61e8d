"""tessera-nri-hook's settings: one frozen object built from the flags (or their
`TESSERA_*` twins); everything below the command line reads this, not argparse."""

from __future__ import annotations

from dataclasses import dataclass

from nri_hook.enforce import OnInvalid


@dataclass(frozen=True, slots=True)
class NriHookConfig:
    # connection to the runtime
    socket: str
    plugin_name: str
    plugin_index: str
    registration_timeout: float
    # allocation records
    node_name: str | None
    integrity_key_file: str
    no_integrity: bool
    on_invalid_record: OnInvalid
    # devices
    device_root: str
    isolation: str
    mps_pipe_dir: str
    hami_core_library: str
    # RDMA VF network devices
    no_vf_netdevs: bool
    vf_rename_prefix: str
    # logs and metrics
    log_format: str
    log_level: str
    log_file: str
    metrics_port: int
    metrics_address: str
