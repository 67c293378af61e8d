"""bench.profile_table: py-spy's collapsed stacks summed into CPU shares, with samples
stopped in a wait (native frames) left out."""

from __future__ import annotations

from pathlib import Path

from bench import profile_table as pt

_LIBC = "0x7f00 (libc.so.6)"
_BOOT = "Thread.run (threading.py:982)"


def _line(thread: str, frames: list[str], count: int) -> str:
    return ";".join([f"thread (101): {thread}", *frames]) + f" {count}"


def test_a_libc_tail_under_a_blocking_call_is_a_wait_and_cpu_in_libc_is_not() -> None:
    assert pt.is_wait([_BOOT, "take_gil (ceval_gil.c:1)", _LIBC])
    assert pt.is_wait([_BOOT, "poll (libc.so.6)"])
    # write() is CPU spent in the C library, not a wait
    assert not pt.is_wait([_BOOT, "write (libc.so.6)"])
    # a Python leaf is running code
    assert not pt.is_wait([_BOOT, "Keyring.sign (tessera/record.py:10)"])
    assert not pt.is_wait([])


def test_shares_by_thread_part_and_frame(tmp_path: Path) -> None:
    raw = tmp_path / "r1-0"
    raw.write_text(
        "\n".join(
            [
                _line("verb_3", [_BOOT, "Keyring.sign (tessera/record.py:10)"], 3),
                _line("verb_7", [_BOOT, "KubeClient._send (kube_edge/client.py:134)"], 1),
                _line(
                    "http-extender", [_BOOT, "Decider._exact (tessera/cluster_decision.py:9)"], 4
                ),
                _line("http-extender", [_BOOT, "take_gil (ceval_gil.c:1)", _LIBC], 10),
                _line(
                    "http-extender",
                    [
                        _BOOT,
                        "run_asgi (uvicorn/protocols/http/httptools_impl.py:1)",
                        "_Connection.exchange (kube_edge/loop_client.py:200)",
                    ],
                    2,
                ),
                "not a stack line",
            ]
        )
        + "\n"
    )
    profile = pt.read([raw])
    assert (profile.samples, profile.waits) == (10, 10)
    # thread numbers are folded: verb_3 and verb_7 are one pool
    assert profile.threads == {"verb": 4, "http-extender": 6}
    # the API client on the loop is its own part, not the HTTP server it runs under
    assert profile.parts["http-extender: API client on the event loop"] == 2
    assert profile.parts["verb: record signing"] == 3
    assert profile.parts["verb: HTTP client (urllib3)"] == 1
    assert profile.parts["http-extender: decision (Decider, policies)"] == 4
    assert profile.self_frames["Keyring.sign (record.py)"] == 3
    assert profile.total_frames["Thread.run (threading.py)"] == 10
    lines = pt.table(profile, top=2)
    assert lines[0] == "10 CPU samples (10 samples in waits left out)."
    assert "| verb: record signing | 30.0 % |" in lines
