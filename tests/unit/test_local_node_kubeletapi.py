"""The kubelet API's pure parts: which run's log, the log query, tail and follow over a real file, who a caller is,
and what an exec runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from kanri.local.node.containerlogs import LogError, LogOptions, log_run, parse_options, read_log, tail_offset
from kanri.local.node.kubeletauth import bearer_token, certificate_user, subresources, verb
from kanri.local.node.kubeletexec import ContainerProcess, ExecRequest, container_environment, exit_status, nsenter_argv
from tests.support import eventually

Obj = dict[str, Any]
TERMINATED = {"terminated": {"exitCode": 1, "reason": "Error"}}


def status(state: Obj, restarts: int = 0, last: Obj | None = None) -> Obj:
    return {"name": "main", "restartCount": restarts, "state": state, "lastState": last or {}}


# --- which run ----------------------------------------------------------------------------------------------------


def test_a_running_container_serves_its_current_run() -> None:
    assert log_run(status({"running": {}}), "p", "main", previous=False) == 0
    assert log_run(status({"running": {}}, 2, TERMINATED), "p", "main", previous=False) == 2


def test_previous_is_the_run_before_the_current_one() -> None:
    assert log_run(status({"running": {}}, 2, TERMINATED), "p", "main", previous=True) == 1
    assert log_run(status(TERMINATED, 1, TERMINATED), "p", "main", previous=True) == 0


def test_while_backing_off_the_crashed_run_is_both_current_and_previous() -> None:
    # The node counts the restart when the next run starts: the run that crashed is still <restartCount>.log.
    backing_off = status({"waiting": {"reason": "CrashLoopBackOff"}}, 0, TERMINATED)
    assert log_run(backing_off, "p", "main", previous=False) == 0
    assert log_run(backing_off, "p", "main", previous=True) == 0


def test_previous_without_a_terminated_run_is_refused_with_the_kubelets_message() -> None:
    with pytest.raises(LogError) as caught:
        log_run(status({"running": {}}), "web", "main", previous=True)
    assert (caught.value.status, str(caught.value)) == (
        400,
        'previous terminated container "main" in pod "web" not found',
    )


def test_a_container_that_never_ran_is_waiting_to_start() -> None:
    with pytest.raises(LogError, match=r'container "main" in pod "web" is waiting to start: ContainerCreating'):
        log_run(status({"waiting": {"reason": "ContainerCreating"}}), "web", "main", previous=False)
    with pytest.raises(LogError, match=r'container "main" in pod "web" is not available'):
        log_run(None, "web", "main", previous=False)


# --- the query ----------------------------------------------------------------------------------------------------


def test_the_query_decodes_like_the_kubelets() -> None:
    assert parse_options({}) == LogOptions()
    assert parse_options({"follow": "true", "previous": "1", "tailLines": "5", "limitBytes": "10"}) == LogOptions(
        follow=True, previous=True, tail_lines=5, limit_bytes=10
    )
    assert parse_options({"tail": "3"}).tail_lines == 3
    assert parse_options({"tail": "all"}).tail_lines is None
    assert parse_options({"stream": "All", "follow": "False"}) == LogOptions()


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"follow": "yes"}, 400),
        ({"tailLines": "x"}, 400),
        ({"tailLines": "-1"}, 422),
        ({"limitBytes": "0"}, 422),
        ({"sinceSeconds": "0"}, 422),
        ({"stream": "Stdout"}, 400),
        ({"timestamps": "true"}, 400),
        ({"sinceSeconds": "60"}, 400),
        ({"sinceTime": "2026-01-01T00:00:00Z"}, 400),
    ],
)
def test_a_bad_or_unsupported_query_is_refused(query: dict[str, str], status: int) -> None:
    with pytest.raises(LogError) as caught:
        parse_options(query)
    assert caught.value.status == status


# --- reading ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "lines", "expected"),
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 5, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),  # a last line still being written counts
        (b"a\nb\nc\n", 0, b""),
        (b"", 3, b""),
        (b"\n\n", 1, b"\n"),
    ],
)
def test_tail_starts_at_the_last_lines(tmp_path: Path, content: bytes, lines: int, expected: bytes) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(content)
    with path.open("rb") as f:
        offset = tail_offset(f, lines)
    assert content[offset:] == expected


def test_tail_reads_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    lines = [f"line {i:06d} {'x' * 90}\n".encode() for i in range(3000)]  # ~300 kB: several 64 KiB blocks
    path.write_bytes(b"".join(lines))
    with path.open("rb") as f:
        offset = tail_offset(f, 1500)
    assert path.read_bytes()[offset:] == b"".join(lines[-1500:])


async def collect(path: Path, options: LogOptions, running: Any = lambda: False) -> bytes:
    return b"".join([chunk async for chunk in read_log(path, options, running=running, poll_interval=0.01)])


async def test_limit_bytes_caps_the_output(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"one\ntwo\nthree\n")
    assert await collect(path, LogOptions(limit_bytes=5)) == b"one\nt"
    assert await collect(path, LogOptions(tail_lines=1, limit_bytes=3)) == b"thr"
    assert await collect(path, LogOptions()) == b"one\ntwo\nthree\n"


async def test_follow_reads_what_is_written_until_the_container_stops(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"before\n")
    alive = asyncio.Event()
    alive.set()
    chunks: list[bytes] = []

    async def follow() -> None:
        async for chunk in read_log(path, LogOptions(follow=True), running=alive.is_set, poll_interval=0.01):
            chunks.append(chunk)

    task = asyncio.create_task(follow())
    await eventually(lambda: joined(chunks, b"before\n"), timeout=10)
    with path.open("ab") as f:
        f.write(b"after\n")
    await eventually(lambda: joined(chunks, b"before\nafter\n"), timeout=10)
    assert not task.done()
    with path.open("ab") as f:
        f.write(b"last\n")  # written just before the container ended: still delivered
    alive.clear()
    await asyncio.wait_for(task, 10)
    assert b"".join(chunks) == b"before\nafter\nlast\n"


async def joined(chunks: list[bytes], expected: bytes) -> bool:
    return b"".join(chunks) == expected


# --- the caller ---------------------------------------------------------------------------------------------------


def test_a_client_certificate_names_the_user_and_groups() -> None:
    peercert = {
        "subject": ((("organizationName", "system:masters"),), (("organizationName", "ops"),), (("commonName", "ann"),))
    }
    user = certificate_user(peercert)
    assert user is not None
    assert (user.name, user.groups) == ("ann", ("system:masters", "ops"))
    assert certificate_user(None) is None
    assert certificate_user({}) is None


def test_bearer_tokens_and_the_kubelets_attributes() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None
    assert subresources("/containerLogs/ns/pod/main") == ["proxy"]
    assert subresources("/healthz") == ["healthz", "proxy"]
    assert (verb("GET"), verb("POST"), verb("DELETE")) == ("get", "create", "delete")


# --- exec ---------------------------------------------------------------------------------------------------------


def test_the_exec_query_and_exit_statuses_are_the_kubelets() -> None:
    request = ExecRequest.from_query({"input": "1", "output": "1", "tty": "true"}, ["sh", "-c", "true"])
    assert (request.stdin, request.stdout, request.stderr, request.tty) == (True, True, False, True)
    assert exit_status(0) == {"metadata": {}, "status": "Success"}
    failed = exit_status(3)
    assert (failed["status"], failed["reason"]) == ("Failure", "NonZeroExitCode")
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]


def test_exec_enters_the_containers_namespaces_as_its_user() -> None:
    argv = nsenter_argv(ContainerProcess(pid=42, uid=26, gid=None), ["psql", "-c", "select 1"])
    assert argv[1:] == [
        "--target=42", "--net", "--mount", "--uts", "--ipc", "--pid", "--root", "--wd",
        "--setuid=26", "--setgid=0", "--", "psql", "-c", "select 1",
    ]  # fmt: skip
    assert "--setuid" not in " ".join(nsenter_argv(ContainerProcess(pid=42, uid=None, gid=None), ["id"]))


def test_the_environment_is_the_container_inits() -> None:
    assert container_environment(os.getpid())["PATH"] == os.environ["PATH"]
