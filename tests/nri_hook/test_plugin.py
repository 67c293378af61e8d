"""The NRI plugin protocol against the runtime simulator, over real unix sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nri_hook import plugin as plugin_module
from nri_hook.plugin import (
    PLUGIN_SERVICE,
    VALID_EVENTS_LEGACY,
    VALID_EVENTS_V0_10,
    Backoff,
    Handler,
    NriPlugin,
    check_identity,
    event_bit,
    event_mask,
    valid_events_for,
)
from protos.nri import api_pb2 as api
from tessera_testbed.containerd import (
    CONTAINERD_1_7,
    CONTAINERD_2_3,
    PluginConnection,
    RuntimeSimulator,
    make_container,
    make_pod,
)
from tessera_ttrpc import CallContext, Code, RpcError


class Recorder(Handler):
    """Records everything; fails CreateContainer for containers named 'refuse'."""

    def __init__(self, events: Iterable[int]) -> None:
        self.events = frozenset(events)
        self.seen: list[tuple[str, ...]] = []
        self.synced: list[tuple[list[str], list[str]]] = []
        self.disconnects = 0

    async def configure(self, request: api.ConfigureRequest) -> None:
        self.seen.append(("configure", request.runtime_version, request.NRI_version))

    async def synchronize(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]
    ) -> Sequence[api.ContainerUpdate]:
        self.synced.append(([p.name for p in pods], [c.name for c in containers]))
        return [api.ContainerUpdate(container_id=c.id) for c in containers]

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        self.seen.append(("create", pod.name, container.name))
        if container.name == "refuse":
            raise RpcError(Code.PERMISSION_DENIED, "refused")
        response = api.CreateContainerResponse()
        response.adjust.env.add(key="SEEN", value=container.name)
        return response

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        self.seen.append(("stop", pod.name, container.name))
        return ()

    async def event(self, event: int, pod: api.PodSandbox, container: api.Container | None) -> None:
        # a StateChange may carry an event number this API version does not name
        name = api.Event.Name(event) if event in api.Event.values() else str(event)
        self.seen.append(("event", name, pod.name, container.name if container else ""))

    def disconnected(self) -> None:
        self.disconnects += 1


SANDBOX_EVENTS = {api.RUN_POD_SANDBOX, api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX}
ALL_OURS = SANDBOX_EVENTS | {api.CREATE_CONTAINER, api.STOP_CONTAINER, api.REMOVE_CONTAINER}


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


async def _connected(
    sock_dir: Path, handler: Handler, **sim_args: object
) -> tuple[RuntimeSimulator, PluginConnection, asyncio.Task[None], asyncio.Event]:
    path = str(sock_dir / "nri.sock")
    sim = RuntimeSimulator(path, **sim_args)  # type: ignore[arg-type]
    await sim.start()
    plugin = NriPlugin(handler, name="test", index="42", socket_path=path)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    conn = await sim.next_plugin()
    return sim, conn, task, stop


async def _finish(sim: RuntimeSimulator, task: asyncio.Task[None], stop: asyncio.Event) -> None:
    stop.set()
    await asyncio.wait_for(task, 5)
    await sim.stop()


def test_identity_rules() -> None:
    check_identity("tessera", "50")
    check_identity("a.b+c_d-e", "00")
    for name, index in [("", "10"), ("bad name", "10"), ("ok", "1"), ("ok", "100"), ("ok", "a1")]:
        with pytest.raises(ValueError):
            check_identity(name, index)


def test_event_masks() -> None:
    assert event_bit(api.CREATE_CONTAINER) == 0x8
    assert event_mask({api.STOP_CONTAINER, api.REMOVE_CONTAINER}) == 0x600
    assert event_mask(ALL_OURS) == 0x60F
    assert valid_events_for("") == VALID_EVENTS_LEGACY
    assert valid_events_for("v0.8.0") == VALID_EVENTS_LEGACY
    assert valid_events_for("v0.10.0") == VALID_EVENTS_V0_10
    assert valid_events_for("v0.12.0") == VALID_EVENTS_V0_10
    assert valid_events_for("v1.0.0") == VALID_EVENTS_V0_10
    assert valid_events_for("unknown") == VALID_EVENTS_LEGACY
    with pytest.raises(ValueError):
        event_mask({api.LAST})


def test_registration_configure_and_synchronize_with_a_2x_runtime(sock_dir: Path) -> None:
    async def body() -> None:
        handler = Recorder(ALL_OURS)
        pod = make_pod("running")
        sim, conn, task, stop = await _connected(
            sock_dir,
            handler,
            sync_pods=[pod],
            sync_containers=[make_container(pod, "main")],
        )
        assert conn.registration is not None
        assert (conn.registration.plugin_name, conn.registration.plugin_idx) == ("test", "42")
        assert conn.events == 0x60F
        assert conn.calls[:2] == ["Configure", "Synchronize"]
        assert handler.seen[0] == ("configure", "v2.3.4", "v0.12.0")
        assert handler.synced == [(["running"], ["main"])]
        assert [u.container_id for u in conn.sync_replies[-1].update] == [
            make_container(pod, "main").id
        ]
        await _finish(sim, task, stop)

    _run(body)


def test_mask_is_clipped_to_what_an_older_runtime_knows(sock_dir: Path) -> None:
    async def body() -> None:
        # UPDATE_POD_SANDBOX (0x800) would get the plugin dropped by containerd 1.7.
        handler = Recorder({api.CREATE_CONTAINER, api.UPDATE_POD_SANDBOX})
        sim, conn, task, stop = await _connected(sock_dir, handler, version=CONTAINERD_1_7)
        assert conn.events == 0x8
        assert sim.dropped == []
        await _finish(sim, task, stop)
        # a v0.12 runtime takes the bit
        handler = Recorder({api.CREATE_CONTAINER, api.UPDATE_POD_SANDBOX})
        sim, conn, task, stop = await _connected(sock_dir, handler, version=CONTAINERD_2_3)
        assert conn.events == 0x808
        await _finish(sim, task, stop)

    _run(body)


def test_split_synchronize_is_answered_chunk_by_chunk(sock_dir: Path) -> None:
    async def body() -> None:
        handler = Recorder(ALL_OURS)
        pods = [make_pod(f"p{i}", uid=f"00000000-0000-4000-8000-00000000000{i}") for i in range(3)]
        containers = [make_container(p, f"c{i}") for i, p in enumerate(pods)]
        sim, conn, task, stop = await _connected(
            sock_dir, handler, sync_pods=pods, sync_containers=containers, sync_chunk=2
        )
        assert sim.dropped == []
        assert [r.more for r in conn.sync_replies] == [True, True, False]
        assert [len(r.update) for r in conn.sync_replies] == [0, 0, 3]
        # the handler saw everything exactly once, after the last chunk
        assert handler.synced == [(["p0", "p1", "p2"], ["c0", "c1", "c2"])]
        await _finish(sim, task, stop)

    _run(body)


@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_events_reach_the_handler_both_ways(sock_dir: Path, version: object) -> None:
    async def body() -> None:
        handler = Recorder(ALL_OURS)
        sim, conn, task, stop = await _connected(sock_dir, handler, version=version)
        pod = make_pod("web")
        main = make_container(pod, "main")
        assert await conn.event(api.RUN_POD_SANDBOX, pod)
        created = await conn.create_container(pod, main)
        assert [(e.key, e.value) for e in created.adjust.env] == [("SEEN", "main")]
        assert not await conn.event(api.START_CONTAINER, pod, main)  # not subscribed
        await conn.stop_container(pod, main)
        assert await conn.event(api.REMOVE_CONTAINER, pod, main)
        assert await conn.event(api.STOP_POD_SANDBOX, pod)
        assert await conn.event(api.REMOVE_POD_SANDBOX, pod)
        assert handler.seen[1:] == [
            ("event", "RUN_POD_SANDBOX", "web", ""),
            ("create", "web", "main"),
            ("stop", "web", "main"),
            ("event", "REMOVE_CONTAINER", "web", "main"),
            ("event", "STOP_POD_SANDBOX", "web", ""),
            ("event", "REMOVE_POD_SANDBOX", "web", ""),
        ]
        dedicated = "RunPodSandbox" in conn.calls
        assert dedicated == (version is CONTAINERD_2_3)
        assert ("StateChange:RUN_POD_SANDBOX" in conn.calls) == (version is CONTAINERD_1_7)
        await _finish(sim, task, stop)

    _run(body)


def test_errors_and_unknown_methods(sock_dir: Path) -> None:
    async def body() -> None:
        handler = Recorder(ALL_OURS)
        sim, conn, task, stop = await _connected(sock_dir, handler)
        pod = make_pod("web")
        with pytest.raises(RpcError) as refused:
            await conn.create_container(pod, make_container(pod, "refuse"))
        assert (refused.value.code, refused.value.message) == (Code.PERMISSION_DENIED, "refused")
        with pytest.raises(RpcError) as unknown:
            await conn.client.call(PLUGIN_SERVICE, "SomeFutureEvent", b"")
        assert unknown.value.code == Code.UNIMPLEMENTED
        # still serving
        created = await conn.create_container(pod, make_container(pod, "after"))
        assert created.adjust.env[0].value == "after"
        await _finish(sim, task, stop)

    _run(body)


def test_reconnects_with_backoff_when_the_runtime_restarts(sock_dir: Path) -> None:
    async def body() -> None:
        path = str(sock_dir / "nri.sock")
        handler = Recorder(ALL_OURS)
        plugin = NriPlugin(
            handler,
            name="test",
            index="42",
            socket_path=path,
            backoff=Backoff(initial=0.02, maximum=0.1),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))  # starts before the runtime exists
        await asyncio.sleep(0.1)
        sim = RuntimeSimulator(path)
        await sim.start()
        first = await sim.next_plugin()
        assert plugin.sessions == 1
        first.close()  # the runtime goes away
        await sim.stop()
        pod = make_pod("survivor")
        sim = RuntimeSimulator(path, sync_pods=[pod], sync_containers=[make_container(pod, "main")])
        await sim.start()
        second = await sim.next_plugin()
        assert plugin.sessions == 2
        assert handler.disconnects == 1
        assert handler.synced[-1] == (["survivor"], ["main"])
        assert (await second.create_container(pod, make_container(pod, "x"))).adjust.env
        await _finish(sim, task, stop)

    _run(body)


def test_launched_plugin_uses_the_inherited_connection(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        runtime_end, plugin_end = socket.socketpair()
        monkeypatch.setenv("NRI_PLUGIN_SOCKET", str(plugin_end.detach()))
        sim = RuntimeSimulator(external=False)
        sim.attach(runtime_end)
        handler = Recorder(ALL_OURS)
        plugin = NriPlugin(handler, name="test", index="42", socket_path="/nonexistent")
        task = asyncio.create_task(plugin.run())
        conn = await sim.next_plugin()
        pod = make_pod("p")
        assert (await conn.create_container(pod, make_container(pod, "c"))).adjust.env
        conn.close()  # the runtime closes the connection: a launched plugin ends
        await asyncio.wait_for(task, 5)
        await sim.stop()

    _run(body)


def test_the_simulator_drops_a_plugin_that_does_not_register(sock_dir: Path) -> None:
    """The simulator enforces the registration timeout, like containerd."""

    async def body() -> None:
        path = str(sock_dir / "nri.sock")
        sim = RuntimeSimulator(path, registration_timeout=0.1)
        await sim.start()
        reader, writer = await asyncio.open_unix_connection(path)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed on us
        assert sim.dropped == ["plugin did not register within the registration timeout"]
        writer.close()
        await sim.stop()

    _run(body)


PLUGIN_METHODS = sorted(api.DESCRIPTOR.services_by_name["Plugin"].methods_by_name)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(method=st.sampled_from(PLUGIN_METHODS), payload=st.binary(max_size=200))
@example(method="StateChange", payload=b"\x08\x10")  # event 16: no name in this API version
def test_arbitrary_payloads_get_an_answer_never_a_crash(
    sock_dir: Path, method: str, payload: bytes
) -> None:
    async def body() -> None:
        sim, conn, task, stop = await _connected(sock_dir, Recorder(ALL_OURS))
        try:
            await conn.client.call(PLUGIN_SERVICE, method, payload, timeout=5)
        except RpcError as exc:
            assert exc.code in (
                Code.INVALID_ARGUMENT,
                Code.PERMISSION_DENIED,
                Code.FAILED_PRECONDITION,
            )
        # the connection survived: the plugin still answers
        pod = make_pod("after")
        assert (await conn.create_container(pod, make_container(pod, "c"))).adjust.env
        await _finish(sim, task, stop)

    _run(body)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=8))
def test_arbitrary_trunk_bytes_end_the_session_cleanly(chunks: list[bytes]) -> None:
    async def body() -> None:
        runtime_end, plugin_end = socket.socketpair()
        handler = Recorder(ALL_OURS)
        plugin = NriPlugin(handler, name="test", index="42", registration_timeout=1.0)
        reader, writer = await asyncio.open_unix_connection(sock=plugin_end)
        session = asyncio.create_task(plugin.serve_connection(reader, writer))
        _, w = await asyncio.open_unix_connection(sock=runtime_end)
        for chunk in chunks:
            w.write(chunk)
        await w.drain()
        w.close()
        registered = await asyncio.wait_for(session, 5)  # returns; never raises
        assert isinstance(registered, bool)  # (garbage that answers the registration is fine)
        assert handler.disconnects == 1

    _run(body)


class Crasher(Recorder):
    """A handler with a bug that only pods named 'boom' reach."""

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        if pod.name == "boom":
            raise KeyError("a bug")
        return await super().create_container(pod, container)

    async def event(self, event: int, pod: api.PodSandbox, container: api.Container | None) -> None:
        if pod.name == "boom":
            raise ZeroDivisionError("another bug")
        await super().event(event, pod, container)


@pytest.mark.parametrize("version", [CONTAINERD_2_3, CONTAINERD_1_7], ids=["2.3", "1.7"])
def test_a_handler_bug_fails_that_call_only_as_internal(sock_dir: Path, version: object) -> None:
    async def body() -> None:
        sim, conn, task, stop = await _connected(sock_dir, Crasher(ALL_OURS), version=version)
        boom = make_pod("boom", namespace="team-a")
        with pytest.raises(RpcError) as failed:
            await conn.create_container(boom, make_container(boom, "main"))
        assert failed.value.code == Code.INTERNAL
        assert "CreateContainer of pod team-a/boom" in failed.value.message
        assert "KeyError" in failed.value.message
        with pytest.raises(RpcError) as failed:
            await conn.event(api.RUN_POD_SANDBOX, boom)
        assert failed.value.code == Code.INTERNAL
        assert "pod team-a/boom" in failed.value.message
        assert "ZeroDivisionError" in failed.value.message
        fine = make_pod("fine")
        assert await conn.event(api.RUN_POD_SANDBOX, fine)
        assert (await conn.create_container(fine, make_container(fine, "c"))).adjust.env
        assert sim.dropped == []
        await _finish(sim, task, stop)

    _run(body)


def test_an_oversized_synchronize_is_refused_and_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plugin_module, "MAX_SYNC_OBJECTS", 3)
    handler = Recorder(ALL_OURS)
    session = plugin_module._Session(handler)
    ctx = CallContext(PLUGIN_SERVICE, "Synchronize", 1, (), None)
    pods = [make_pod(f"p{i}", uid=f"00000000-0000-4000-8000-00000000000{i}") for i in range(4)]

    async def body() -> None:
        chunk = api.SynchronizeRequest(pods=pods[:2], more=True)
        assert (await session._synchronize(chunk, ctx)).more
        with pytest.raises(RpcError) as refused:
            await session._synchronize(api.SynchronizeRequest(pods=pods[2:], more=True), ctx)
        assert refused.value.code == Code.RESOURCE_EXHAUSTED
        # what was collected is dropped: a fresh Synchronize starts from nothing
        await session._synchronize(api.SynchronizeRequest(pods=pods[:1]), ctx)
        assert handler.synced == [(["p0"], [])]

    asyncio.run(body())


@pytest.mark.parametrize("chunk", [0, 50], ids=["one-message", "chunked"])
def test_a_busy_node_synchronize_fits_every_limit(sock_dir: Path, chunk: int) -> None:
    """500 pods with 1,000 containers, carrying as much annotation text as fits one 4 MiB
    message (or twice that and more, split in chunks as containerd splits it)."""

    async def body() -> None:
        per_pod = 4500 if chunk == 0 else 20000
        pods = [
            make_pod(
                f"p{i}",
                uid=f"00000000-0000-4000-8000-{i:012d}",
                annotations={"example.com/config": "x" * per_pod},
            )
            for i in range(500)
        ]
        containers = [make_container(p, name) for p in pods for name in ("main", "sidecar")]
        size = api.SynchronizeRequest(pods=pods, containers=containers).ByteSize()
        if chunk == 0:
            assert 3 << 20 < size < 4 << 20
        else:
            assert size > 8 << 20
        handler = Recorder(ALL_OURS)
        sim, _, task, stop = await _connected(
            sock_dir, handler, sync_pods=pods, sync_containers=containers, sync_chunk=chunk
        )
        assert sim.dropped == []
        assert [len(names) for names in handler.synced[0]] == [500, 1000]
        await _finish(sim, task, stop)

    _run(body)


def test_a_synchronize_of_millions_of_empty_pods_is_refused_before_decoding(
    sock_dir: Path,
) -> None:
    """4 MiB of empty PodSandbox entries would decode into some 300 MiB."""

    async def body() -> None:
        sim, conn, task, stop = await _connected(sock_dir, Recorder(ALL_OURS))
        with pytest.raises(RpcError) as refused:
            await conn.client.call(
                PLUGIN_SERVICE, "Synchronize", b"\x0a\x00" * ((2 << 20) - 64), timeout=10
            )
        assert refused.value.code == Code.RESOURCE_EXHAUSTED
        assert "would decode into over" in refused.value.message
        pod = make_pod("after")
        assert (await conn.create_container(pod, make_container(pod, "c"))).adjust.env
        await _finish(sim, task, stop)

    _run(body)
