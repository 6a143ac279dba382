"""kanri.local.ports: ports from KANRI_PORT_RANGE in turn, never a taken one; the kernel's choice without it."""

from __future__ import annotations

import socket

import pytest

from kanri.local import ports


def test_without_a_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.PORT_RANGE_ENV, raising=False)
    port = ports.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))


def test_ports_come_from_the_range_in_turn_and_a_taken_one_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # three ports above make test's two ranges and below the ephemeral range: nobody else hands them out
    low = next(port for port in range(29000, 29990) if all(_free(port + i) for i in range(3)))
    monkeypatch.setenv(ports.PORT_RANGE_ENV, f"{low}-{low + 2}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", low + 1))
        taken.listen()
        handed = [ports.free_port() for _ in range(4)]
    assert sorted(set(handed)) == [low, low + 2], handed
    assert handed[0] != handed[1], f"handed out in turn, not the same port twice in a row: {handed}"
    assert handed[2] == handed[0], handed


def test_a_range_with_nothing_free_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    low = next(port for port in range(29000, 29990) if _free(port))
    monkeypatch.setenv(ports.PORT_RANGE_ENV, f"{low}-{low}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", low))
        with pytest.raises(OSError, match=f"no free port in KANRI_PORT_RANGE={low}-{low}"):
            ports.free_port()


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("value", ["20000", "20000-19999", "80-90", "a-b", "20000-70000"])
def test_a_malformed_range_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"KANRI_PORT_RANGE='{value}'"):
        ports.port_range(value)


def test_a_range_is_parsed_inclusive() -> None:
    assert ports.port_range("15000-22499") == (15000, 22499)
    assert ports.port_range("") is None
