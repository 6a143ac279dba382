"""An RDS emulator for tests and benchmarks: moto's server behind a proxy of ours that does what moto does not.

moto 5.2.5 answers RDS's API with AWS's shapes and errors, but synchronously (an instance is ``available`` at once),
accepts a storage shrink, ignores ApplyImmediately and has no final-snapshot rule. In front of it this proxy adds, as
RDS documents them: statuses over time (creating -> backing-up -> available, modifying [-> storage-optimization] ->
available, deleting -> DBInstanceNotFound; a final snapshot ``creating`` until the deletion ends), the modify and
delete rules (``rules``), pending modifications until the maintenance window, faults on demand (ThrottlingException,
transient 5xx, a rate limit) and a log of every call.

    with RdsEmulator(Delays(creating=0.5)) as rds:
        client = rds.client()                      # boto3, endpoint_url = the proxy, SDK retries off
        client.create_db_instance(...)
        rds.faults.throttle(3)                     # the next three calls: ThrottlingException
        assert rds.log.count("ModifyDBInstance") == 0

Standalone (for benchmarks, or an operator in another process): ``python -m tests.rds_emulator --port N``; faults and
the call log are then reached at ``/_emulator/faults`` and ``/_emulator/calls``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any

from .faults import Call, CallLog, Faults
from .lifecycle import Clock, Delays
from .moto_process import MotoProcess
from .server import EmulatorServer
from .wire import RdsError

__all__ = ["Call", "CallLog", "Delays", "Faults", "ManualClock", "RdsEmulator", "RdsError"]


class ManualClock:
    """A clock a test moves by hand (``advance``), so status changes happen exactly when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RdsEmulator:
    """moto plus the proxy, the proxy serving from its own thread (boto3's calls block; the test's loop must not)."""

    def __init__(self, delays: Delays | None = None, clock: Clock = time.monotonic, port: int = 0) -> None:
        self._moto = MotoProcess()
        self._server = EmulatorServer(self._moto.url, delays or Delays(), clock)
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    @property
    def moto_url(self) -> str:
        """moto's own server behind the proxy (for comparisons: it has none of the emulator's rules)."""
        return self._moto.url

    @property
    def faults(self) -> Faults:
        return self._server.faults

    @property
    def log(self) -> CallLog:
        return self._server.log

    def start(self) -> RdsEmulator:
        self._moto.start()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rds-emulator", daemon=True)
        self._thread.start()
        self._run(self._server.start(self._port))
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._run(self._server.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            self._loop = self._thread = None
        self._moto.stop()

    def __enter__(self) -> RdsEmulator:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def status(self, identifier: str, region: str = "us-east-1") -> str | None:
        """The emulator's own status for an instance it tracks (None once gone or never seen)."""
        return self._server.lifecycles.status((region, identifier.lower()))

    def maintenance(self, identifier: str, region: str = "us-east-1") -> bool:
        """Runs the instance's maintenance window now; True if pending modifications were applied."""
        return bool(self._run(self._server.maintenance(region, identifier)))

    def client(self, region: str = "us-east-1", attempts: int = 1) -> Any:
        """A boto3 RDS client for the emulator; ``attempts=1`` turns the SDK's own retries off, so a test sees
        each fault instead of botocore retrying past it."""
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]

        return boto3.client(
            "rds",
            endpoint_url=self.endpoint,
            region_name=region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",  # the emulator checks no signature
            config=Config(retries={"total_max_attempts": attempts, "mode": "standard"}),
        )

    def _run(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)
