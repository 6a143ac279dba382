"""What the RDS emulator (tests/rds_emulator) costs per call, against moto's server alone, and how many calls a
second it answers: the numbers a test's request budget and poll delays must be read against.

    .venv/bin/python bench/cloud_rds_emulator.py [--calls 300] [--threads 5]

Prints median and 95th-percentile latency of DescribeDBInstances (one instance present) straight to moto and through
the emulator, then the calls a second of ``--threads`` clients through the emulator. Numbers, never an assertion.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `tests` is a package of the repository

from tests.rds_emulator import Delays, RdsEmulator


def _client(endpoint: str) -> Any:
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client("rds", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing",
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))  # fmt: skip


def _latencies(client: Any, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        client.describe_db_instances(DBInstanceIdentifier="bench")
        out.append(time.perf_counter() - start)
    return out


def _summary(name: str, values: list[float]) -> str:
    p95 = statistics.quantiles(values, n=20)[18]
    return f"{name:<28} median {statistics.median(values) * 1000:6.2f} ms   p95 {p95 * 1000:6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=5)
    args = parser.parse_args()
    with RdsEmulator(Delays.instant()) as rds:
        proxied = _client(rds.endpoint)
        direct = _client(rds.moto_url)
        proxied.create_db_instance(DBInstanceIdentifier="bench", DBInstanceClass="db.t3.micro", Engine="postgres",
                                   MasterUsername="app", MasterUserPassword="not-a-real-secret",
                                   AllocatedStorage=20)  # fmt: skip
        _latencies(direct, 20)  # warm both paths
        _latencies(proxied, 20)
        print(_summary("moto alone", _latencies(direct, args.calls)))
        print(_summary("through the emulator", _latencies(proxied, args.calls)))
        clients = [_client(rds.endpoint) for _ in range(args.threads)]
        start = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda c: _latencies(c, args.calls // args.threads), clients))
        elapsed = time.perf_counter() - start
        total = args.calls // args.threads * args.threads
        print(f"{args.threads} clients through the emulator: {total / elapsed:6.1f} calls/s "
              f"(peak {rds.log.peak_rate():.0f} in one second)")  # fmt: skip


if __name__ == "__main__":
    main()
