"""Benchmark the local control plane: build time, start-to-ready time, memory.

    .venv/bin/python bench/controlplane.py            # warm numbers (binary already built)
    .venv/bin/python bench/controlplane.py --cold     # also a cold build: empty GOCACHE and GOMODCACHE

Prints a Markdown table; record it in docs/benchmarks.md with the command that produced it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from kanri.local import ControlPlane, controlplane_binary


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def summary(seconds: list[float]) -> str:
    return f"median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s"


def cold_build_seconds() -> float:
    """Build into a scratch dir with empty Go caches: what a new machine pays, module downloads included."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {"GOCACHE": f"{scratch}/gocache", "GOMODCACHE": f"{scratch}/gomodcache", "GOFLAGS": "-modcacherw"}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            started = time.monotonic()
            controlplane_binary(out_dir=Path(scratch) / "out")
            return time.monotonic() - started
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", action="store_true", help="also measure a build from empty Go caches")
    parser.add_argument("--restarts", type=int, default=3, help="warm restarts to time")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds to idle before the second RSS reading")
    args = parser.parse_args()

    rows: list[tuple[str, str]] = []
    if args.cold:
        rows.append(("cold build (empty GOCACHE + GOMODCACHE)", f"{cold_build_seconds():.0f} s"))
    started = time.monotonic()
    binary = controlplane_binary()
    rows.append(("up-to-date check of the build (no-op)", f"{time.monotonic() - started:.2f} s"))
    rows.append(("binary size", f"{binary.stat().st_size / 2**20:.0f} MiB"))

    with tempfile.TemporaryDirectory() as scratch:
        cp = ControlPlane(Path(scratch) / "bench", binary)
        started = time.monotonic()
        endpoint = cp.start(exit_with_parent=True)
        first = time.monotonic() - started
        rows.append(("first start to ready (new data dir: certificates, bootstrap)", f"{first:.1f} s"))
        rows.append(("RSS right after ready", f"{rss_mib(endpoint.pid):.0f} MiB"))
        time.sleep(args.settle)
        rows.append((f"RSS after {args.settle:.0f} s idle", f"{rss_mib(endpoint.pid):.0f} MiB"))
        cp.stop()

        warm: list[float] = []
        stops: list[float] = []
        for _ in range(args.restarts):
            started = time.monotonic()
            cp.start(exit_with_parent=True)
            warm.append(time.monotonic() - started)
            started = time.monotonic()
            cp.stop()
            stops.append(time.monotonic() - started)
        runs = f"{args.restarts} runs"
        rows.append((f"warm start to ready (existing data dir, {runs})", summary(warm)))
        rows.append((f"stop: SIGTERM to exit ({runs})", summary(stops)))

    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
