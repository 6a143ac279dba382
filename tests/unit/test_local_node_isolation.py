"""Pure parts of a container's isolation: cgroup limits from resources, cgroup discovery, the root's layout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kanri.local.node.cgroups import CFS_PERIOD_US, Cgroups, Limits, container_limits, discover, leftover_cgroups
from kanri.local.node.rootfs import host_mountpoint, named_paths, root_layout


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({}, Limits()),
        ({"limits": {"memory": "64Mi"}}, Limits(memory_bytes=64 << 20)),
        ({"limits": {"memory": "1G"}}, Limits(memory_bytes=10**9)),
        # A limit alone is also the request (the API server defaults it so): shares follow it.
        ({"limits": {"cpu": "200m"}}, Limits(cpu_quota_us=20_000, cpu_shares=204)),
        ({"limits": {"cpu": "2"}, "requests": {"cpu": "500m"}}, Limits(cpu_quota_us=200_000, cpu_shares=512)),
        ({"limits": {"cpu": "1m"}}, Limits(cpu_quota_us=1000, cpu_shares=2)),  # the kernel's minimum quota
        ({"requests": {"cpu": "250m", "memory": "1Gi"}}, Limits(cpu_shares=256)),  # requests limit nothing
        ({"limits": {"cpu": "0.0001"}}, Limits(cpu_quota_us=1000, cpu_shares=2)),  # rounded up to 1m
    ],
)
def test_container_limits_follow_the_kubelet(resources: dict[str, dict[str, str]], expected: Limits) -> None:
    assert container_limits({"name": "c", "resources": resources}) == expected
    assert expected.cpu_period_us == CFS_PERIOD_US


def test_discover_finds_each_v1_controller_under_the_process_own_cgroup(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text(
        "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/user.slice\n0::/\n"
    )
    (tmp_path / "mountinfo").write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    assert discover(tmp_path) == {
        "freezer": Path("/sys/fs/cgroup/freezer"),
        "memory": Path("/sys/fs/cgroup/memory/process_api/abc"),
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct/user.slice"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct/user.slice"),
    }  # no pids mount: not used


def test_no_cgroups_means_no_limits_but_containers_still_run(tmp_path: Path) -> None:
    groups = Cgroups(tmp_path, "n", bases={})
    assert not groups.available
    assert groups.container("uid", "main", Limits(memory_bytes=1)) is None
    assert groups.close() == []
    assert leftover_cgroups(tmp_path) == []


def test_cgroups_on_a_fake_tree_are_recorded_and_removed(tmp_path: Path) -> None:
    # Plain directories stand in for a cgroup hierarchy: what is made, written, recorded and removed.
    base = tmp_path / "fs"
    groups = Cgroups(tmp_path / "data", "node-a", bases={"memory": base / "memory", "cpu": base / "cpu"})
    group = groups.container("u1", "main", Limits(memory_bytes=1 << 20, cpu_quota_us=50_000, cpu_shares=512))
    assert group is not None
    assert (base / "memory/kanri/node-a/podu1/main/memory.limit_in_bytes").read_text() == str(1 << 20)
    assert (base / "cpu/kanri/node-a/podu1/main/cpu.cfs_quota_us").read_text() == "50000"
    assert (base / "cpu/kanri/node-a/podu1/main/cpu.shares").read_text() == "512"
    # the pod's weight against its sibling pods is the sum of its containers' (a BestEffort pod's is 2, not 1024)
    assert (base / "cpu/kanri/node-a/podu1/cpu.shares").read_text() == "512"
    assert str(base / "memory/kanri/node-a") in leftover_cgroups(tmp_path / "data")
    for directory in [*group.dirs.values(), base / "cpu/kanri/node-a/podu1"]:  # as the kernel shows empty ones
        for file in [f for f in directory.iterdir() if f.is_file()]:
            file.unlink()
    assert groups.close() == []
    assert leftover_cgroups(tmp_path / "data") == []
    assert not (base / "memory/kanri").exists()


def test_root_binds_the_system_read_only_and_keeps_etc_run_tmp_its_own(tmp_path: Path) -> None:
    host = tmp_path / "host"
    for name in ("usr/bin", "usr/lib", "var/lib", "opt", "etc/ssl", "work/app/src", "home/me"):
        (host / name).mkdir(parents=True)
    (host / "bin").symlink_to("usr/bin")
    (host / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    steps, bound = root_layout(tmp_path / "tmp", [str(host / "work/app/src"), str(host / "usr/lib")], host=host)
    by_target = {step["target"]: step for step in steps}
    assert by_target["/usr"] == {"op": "bind", "source": str(host / "usr"), "target": "/usr", "readOnly": True}
    assert by_target["/bin"] == {"op": "symlink", "target": "/bin", "link": "usr/bin"}
    assert by_target["/etc"]["op"] == "snapshot"
    assert by_target["/run"]["op"] == "tmpfs"
    assert by_target["/tmp"] == {"op": "bind", "source": str(tmp_path / "tmp"), "target": "/tmp", "readOnly": False}
    assert (by_target["/home"]["op"], by_target["/root"]["mode"]) == ("dir", 0o700)  # empty, not the host's
    assert [step["op"] for step in steps if step["target"] in ("/dev", "/proc", "/sys")] == ["dev", "proc", "sys"]
    # Named paths the system binds do not cover are bound where they are; /usr/lib is already there.
    extra = [step for step in steps if step.get("source", "").startswith(str(host / "work"))]
    assert extra == [{"op": "bind", "source": str(host / "work/app/src"), "target": str(host / "work/app/src"),
                      "readOnly": True}]  # fmt: skip
    assert "/etc/ssl" in bound  # a directory of /etc is the host's, read-only
    assert "/home" not in bound


def test_named_paths_are_the_existing_absolute_ones(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "run.sh").write_text("")
    words = [f"{tmp_path}/src:{tmp_path}/missing", f"{tmp_path}/run.sh", "relative/x", "-c", "echo /etc"]
    assert named_paths(words) == [str(tmp_path), f"{tmp_path}/src"]


def test_a_mountpoint_is_made_on_the_host_only_under_a_read_only_bind(tmp_path: Path) -> None:
    bound = ["/usr", "/var", str(tmp_path)]
    assert host_mountpoint("/var/lib/postgresql/data", bound)
    assert host_mountpoint(f"{tmp_path}/x", bound)
    assert not host_mountpoint("/etc/kanri/superuser", bound)  # the container's own /etc snapshot
    assert not host_mountpoint("/data", bound)  # the container's own root tmpfs
    if os.path.realpath("/var/run") == "/run":
        assert not host_mountpoint("/var/run/postgresql", bound)  # through the symlink: the container's /run
