"""tessera-nri-hook: the command line of tessera's containerd NRI plugin."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from nri_hook.adjust import ISOLATION_NONE, Settings
from nri_hook.config import NriHookConfig
from nri_hook.devices import HostDevices
from nri_hook.enforce import Enforcer, EnforcerConfig, Metrics
from nri_hook.netdev import NetdevMover
from nri_hook.plugin import (
    PLUGIN_IDX_ENV,
    PLUGIN_NAME_ENV,
    PLUGIN_SOCKET_ENV,
    NriPlugin,
    check_identity,
)
from tessera.record_keys import KeyFileError
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_cli import CliParser, ConfigError, config_from
from tessera_cli.metrics import serve_metrics
from tessera_cli.paths import check_directory, check_socket_path
from tessera_edge.keyfiles import KeyringSource
from tessera_edge.logs import setup_logging
from tessera_edge.node_cli import node_parser
from tessera_edge.threads import name_os_threads

log = logging.getLogger("nri_hook")

DESCRIPTION = f"""\
tessera's containerd NRI plugin. For every container containerd creates, it reads the
pod's {ALLOCATION_ANNOTATION} annotation (the scheduler's allocation record), verifies its
integrity, node and pod UID, and adds the allocated GPU and RDMA device nodes, the
environment of the GPU isolation layer and its mounts. When a pod sandbox starts it moves
the pod's RDMA VF network devices into the pod's network namespace, and brings them back
when the sandbox stops. Pods without the annotation are left untouched.

It runs as an external plugin dialing the runtime's NRI socket (reconnecting whenever the
runtime restarts), or, when containerd launches it from its plugin directory, on the
connection passed in {PLUGIN_SOCKET_ENV}."""

EPILOG = """\
exit status: 0 after SIGTERM/SIGINT or when a launching runtime closes the connection;
2 for an invalid flag, TESSERA_* or NRI_PLUGIN_* variable or path, an unreadable integrity key,
or no --isolation chosen (one line on stderr naming it).
See docs/nri_hook.md for what is injected and how to deploy it."""


def build_parser() -> CliParser:
    return node_parser("tessera-nri-hook", DESCRIPTION, EPILOG, NriHookConfig, Metrics.DEFAULT_PORT)


def launched_identity(name: str, index: str) -> tuple[str, str]:
    """Name and index from a launching runtime's environment (v0.3.0 passes NN-name)."""
    env_name = os.environ.get(PLUGIN_NAME_ENV, "")
    env_index = os.environ.get(PLUGIN_IDX_ENV, "")
    if env_name:
        match = re.match(r"^(\d\d)-(.+)$", env_name)
        name = match.group(2) if match else env_name
    return name, env_index or index


def check_config(config: NriHookConfig, name: str, index: str) -> Settings:
    """Everything that can be checked before starting: a `ConfigError` naming the flag (or
    environment variable) and what is wrong."""
    env_name, env_index = os.environ.get(PLUGIN_NAME_ENV), os.environ.get(PLUGIN_IDX_ENV)
    try:
        check_identity(name, "00")
    except ValueError as exc:
        raise ConfigError(PLUGIN_NAME_ENV if env_name else "--plugin-name", str(exc)) from None
    try:
        check_identity("x", index)
    except ValueError as exc:
        raise ConfigError(PLUGIN_IDX_ENV if env_index else "--plugin-index", str(exc)) from None
    fd_text = os.environ.get(PLUGIN_SOCKET_ENV, "")
    if fd_text:
        _check_inherited_socket(fd_text)
    else:
        # the runtime may not be up yet (the plugin retries), but the directory must exist
        check_socket_path("--socket", Path(config.socket), directory_must_exist=True)
    check_directory("--device-root", Path(config.device_root))
    isolation = check_isolation(config)
    try:
        return Settings(
            isolation=isolation,
            mps_pipe_dir=config.mps_pipe_dir,
            hami_core_library=config.hami_core_library,
            mps_client_uid=config.mps_client_user,
        )
    except ValueError as exc:
        raise ConfigError("--isolation", str(exc)) from None


def check_isolation(config: NriHookConfig) -> str:
    """The layer to configure. Every tessera node advertises GPU shares, and a share the
    node does not limit lets one pod take a GPU's memory from its neighbours, so running
    without a layer must be chosen twice: `--isolation=none --allow-unisolated-sharing`."""
    if config.isolation is None:
        raise ConfigError(
            "--isolation",
            "no GPU isolation layer chosen, so GPU shares would not be limited in memory or "
            "compute: choose mps or hami-core (docs/isolation.md), or none together with "
            "--allow-unisolated-sharing",
        )
    if config.isolation == ISOLATION_NONE and not config.allow_unisolated_sharing:
        raise ConfigError(
            "--isolation none",
            "GPU shares would not be limited in memory or compute: choose mps or hami-core "
            "(docs/isolation.md), or add --allow-unisolated-sharing to accept that",
        )
    return config.isolation


def _check_inherited_socket(fd_text: str) -> None:
    try:
        fd = int(fd_text)
        mode = os.fstat(fd).st_mode
    except (ValueError, OSError):
        raise ConfigError(
            f"{PLUGIN_SOCKET_ENV}={fd_text[:40]!r}", "not an open file descriptor"
        ) from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{PLUGIN_SOCKET_ENV}={fd_text}", f"descriptor {fd} is not a socket")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    config = config_from(NriHookConfig, parser.parse_args(argv))
    name, index = launched_identity(config.plugin_name, config.plugin_index)
    logging_set_up = False

    def fail(exc: ConfigError) -> NoReturn:
        if config.log_file and logging_set_up:  # the log file says why it did not start, too
            log.error("%s: %s", parser.describe(exc.flag), exc.problem)
        raise SystemExit(parser.fail(exc))

    try:
        settings = check_config(config, name, index)
    except ConfigError as exc:
        fail(exc)
    try:
        setup_logging(config.log_format, config.log_level, config.log_file)
    except OSError as exc:
        fail(ConfigError("--log-file", f"{config.log_file}: cannot open: {exc.strerror or exc}"))
    logging_set_up = True
    name_os_threads()
    try:
        return run(config, settings, name, index)
    except ConfigError as exc:
        fail(exc)


def run(config: NriHookConfig, settings: Settings, name: str, index: str) -> int:
    """Serve until SIGTERM/SIGINT or the launching runtime closes the connection."""
    node = config.node_name
    if config.no_integrity:
        keys = KeyringSource.fixed(None)
    else:
        try:
            keys = KeyringSource(config.integrity_key_file)
        except KeyFileError as exc:
            raise ConfigError(
                "--integrity-key-file",
                f"{config.integrity_key_file}: {exc} (use --no-integrity only on test clusters)",
            ) from None
    metrics: Metrics | None = None
    if config.metrics_port:
        metrics = Metrics(node)
        serve_metrics(metrics.registry, config.metrics_port, config.metrics_address)
        metrics.isolation(settings.isolation)
    if config.no_integrity:
        log.warning("record integrity is NOT checked (--no-integrity): test clusters only")
    if settings.isolation == ISOLATION_NONE:
        log.warning(
            "GPU shares are NOT isolated (--isolation=none --allow-unisolated-sharing): "
            "pods sharing a GPU are not limited in memory or compute"
        )
    enforcer = Enforcer(
        EnforcerConfig(
            node_name=node,
            settings=settings,
            on_invalid=config.on_invalid_record,
            require_integrity=not config.no_integrity,
            move_vf_netdevs=not config.no_vf_netdevs,
            vf_rename_prefix=config.vf_rename_prefix,
        ),
        keys,
        HostDevices(config.device_root),
        NetdevMover(config.device_root),
        metrics,
    )
    plugin = NriPlugin(
        enforcer,
        name=name,
        index=index,
        socket_path=config.socket,
        registration_timeout=config.registration_timeout,
    )
    log.info(
        "tessera NRI plugin %s-%s starting: node %s, isolation %s, device root %s, "
        "invalid records: %s",
        index,
        name,
        node,
        settings.isolation,
        config.device_root,
        config.on_invalid_record,
    )
    # Everything allocated so far (imports, protobuf descriptors) lives as long as the
    # process: keep it out of the collector's way so full collections stay short.
    gc.collect()
    gc.freeze()
    asyncio.run(_run(plugin, enforcer))
    return 0


async def _run(plugin: NriPlugin, enforcer: Enforcer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    maintaining = asyncio.create_task(enforcer.maintain(stop))
    try:
        await plugin.run(stop)  # returns early when a launching runtime goes away
    finally:
        stop.set()
        await maintaining
    log.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
