"""The e2e secret scan's walk over a node's container logs (tests/e2e/secret_scan.py): it finds every
``pods/<pod>/<container>/<n>.log`` and nothing else, and a directory removed while it walks (a deleted cluster's
volume, which once failed a test's teardown with FileNotFoundError) is skipped."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import secret_scan


def test_every_container_log_is_read_and_nothing_else(tmp_path: Path) -> None:
    for node in ("n1", "n2"):
        logs = tmp_path / "node" / node / "pods" / f"ns_{node}_uid" / "postgres"
        logs.mkdir(parents=True)
        (logs / "0.log").write_text(f"log of {node}")
        (logs / "0.log.tmp").write_text("not a log")
    (tmp_path / "node" / "n1" / "volumes" / "pvc" / "pgdata").mkdir(parents=True)
    (tmp_path / "node" / "n1" / "volumes" / "pvc" / "pgdata" / "postmaster.log").write_text("not a container log")
    found = dict(secret_scan._container_logs(tmp_path))
    assert found == {"node/n1/pods/ns_n1_uid/postgres/0.log": "log of n1",
                     "node/n2/pods/ns_n2_uid/postgres/0.log": "log of n2"}  # fmt: skip


def test_a_directory_removed_during_the_walk_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "node" / "n1" / "pods" / "ns_p_uid" / "postgres"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("kept")
    doomed = tmp_path / "node" / "n1" / "volumes" / "pvc" / "pgdata" / "pg_xact"
    doomed.mkdir(parents=True)
    scandir = os.scandir

    class Listed:
        """pgdata listed (pg_xact in it), then pg_xact removed before the walk enters it, as the node does."""

        def __init__(self, path: Path) -> None:
            with scandir(path) as entries:
                self.entries = iter(list(entries))
            shutil.rmtree(doomed)

        def __enter__(self) -> Listed:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def __iter__(self) -> Iterator[os.DirEntry[str]]:
            return self.entries

        def __next__(self) -> os.DirEntry[str]:
            return next(self.entries)

        def close(self) -> None:
            return None

    def listing(path: Any = ".") -> Any:  # (shutil.rmtree lists by file descriptor: passed through)
        if isinstance(path, str | os.PathLike) and Path(path) == doomed.parent and doomed.exists():
            return Listed(Path(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", listing)
    assert secret_scan._container_logs(tmp_path) == [("node/n1/pods/ns_p_uid/postgres/0.log", "kept")]
    assert not doomed.exists(), "the walk went through pgdata"
