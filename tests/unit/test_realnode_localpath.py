"""The local-path add-on's parts that need no cluster (docs/real-nodes.md, "Add-ons"): its StorageClass is the
default one only when asked, its process is found by name by any later process (as ``kanri local down`` finds the
one ``up`` started) and stopped, and the real-node port-forward's kubectl command line."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kanri.local.access import kubectl_port_forward
from kanri.local.realnode import local as realnode_local
from kanri.local.realnode.addons.localpath import (
    DEFAULT_CLASS_ANNOTATION,
    NAME,
    STORAGE_CLASS,
    LocalPathProvisioner,
    manifests,
)


def storage_class(default_class: bool) -> dict[str, Any]:
    objects = manifests({"real-0": "/v/real-0"}, "kanri.local/kanri-tools:0.1.0", default_class=default_class)
    (found,) = [o for o in objects if o["kind"] == "StorageClass"]
    assert found["metadata"]["name"] == STORAGE_CLASS
    assert found["volumeBindingMode"] == "WaitForFirstConsumer"
    return found


def test_the_storage_class_is_the_default_one_only_when_asked() -> None:
    assert storage_class(True)["metadata"]["annotations"] == {DEFAULT_CLASS_ANNOTATION: "true"}
    # "false", not absent: applying it over a class that was the default takes the default away
    assert storage_class(False)["metadata"]["annotations"] == {DEFAULT_CLASS_ANNOTATION: "false"}


def provisioner(work_dir: Path) -> LocalPathProvisioner:
    return LocalPathProvisioner(work_dir, work_dir, work_dir, {}, "")


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process that looks like the provisioner of ``tmp_path/a`` (the binary's name as argv[0], its kubeconfig
    flag), in a session of its own as ``start`` makes it."""
    argv0 = str(tmp_path / "bin" / NAME)
    code = "import time; time.sleep(120)"
    kubeconfig = f"--kubeconfig={tmp_path / 'a' / 'kubeconfig'}"
    process = subprocess.Popen(
        [argv0, "-c", code, "start", kubeconfig], executable=sys.executable, start_new_session=True
    )
    # Popen returns once the child's exec closed its close-on-exec pipe, which the kernel does before it has set
    # the new command line: /proc/<pid>/cmdline reads empty for a moment (5 in 100 right after Popen, measured)
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    deadline = time.monotonic() + 10
    while not cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cmdline.read_bytes(), f"the stand-in (pid {process.pid}) has no command line after 10 s"
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_running_provisioner_is_found_by_name_and_stopped_by_another_object(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    assert provisioner(tmp_path / "a").pids() == {stand_in.pid}
    assert provisioner(tmp_path / "a").leftovers() == [f"process {stand_in.pid} ({NAME})"]
    assert provisioner(tmp_path / "b").pids() == set()  # another cluster's provisioner is not this one

    provisioner(tmp_path / "a").stop()  # not the object that started it: found by name

    assert stand_in.wait(timeout=5) == -15  # SIGTERM first
    assert provisioner(tmp_path / "a").pids() == set()
    assert provisioner(tmp_path / "a").leftovers() == []


def test_stopping_a_provisioner_that_does_not_run_does_nothing(tmp_path: Path) -> None:
    provisioner(tmp_path).stop()
    assert provisioner(tmp_path).leftovers() == []


def test_a_cluster_without_real_nodes_does_not_run_them(tmp_path: Path) -> None:
    assert not realnode_local.real_nodes_run(tmp_path)


def test_kubectl_port_forward_names_the_cluster_namespace_resource_and_address() -> None:
    argv = kubectl_port_forward(Path("/c/admin.kubeconfig"), "svc/web", "shop", "0:8080", "127.0.0.1")
    assert argv == [
        "kubectl", "--kubeconfig=/c/admin.kubeconfig", "-n", "shop", "port-forward", "svc/web", "0:8080",
        "--address=127.0.0.1",
    ]  # fmt: skip
    assert kubectl_port_forward(Path("/k"), "web-0", "default", "5432:5432", "0.0.0.0")[5] == "pod/web-0"
    assert kubectl_port_forward(Path("/k"), "pod/web-0", "default", "5432:5432", "0.0.0.0")[5] == "pod/web-0"
