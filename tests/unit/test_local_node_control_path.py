"""Where the node host's control socket lives: a Unix socket path must fit sun_path (108 bytes)."""

from __future__ import annotations

from pathlib import Path

from kanri.local.node.control import SHORT_DIR, socket_path


def test_a_short_host_dir_keeps_its_socket_inside() -> None:
    assert socket_path(Path("/var/lib/kanri/node")) == Path("/var/lib/kanri/node/control.sock")


def test_a_deep_host_dir_gets_a_short_stable_path() -> None:
    deep = Path("/tmp/pytest-of-root/pytest-195/test_up_down_and_restart_keep_0/kanri-home/clusters/default/node")
    path = socket_path(deep)
    assert path.parent == SHORT_DIR
    assert len(str(path)) < 100
    assert path == socket_path(deep)  # the CLI finds what the host bound
    assert path != socket_path(deep / "other")
