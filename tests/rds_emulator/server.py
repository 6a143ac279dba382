"""The emulator's HTTP side: an aiohttp app that answers RDS's query protocol by forwarding to moto and correcting
what moto does not do (statuses over time, the modify and delete rules, faults), plus a small control API.

``EmulatorServer`` runs in whatever event loop starts it (the standalone ``python -m tests.rds_emulator``);
``RdsEmulator`` (in ``__init__``) runs one in its own thread for tests that call boto3 synchronously.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from typing import Any

import aiohttp
from aiohttp import web

from . import rules, wire
from .faults import CallLog, Faults
from .lifecycle import AVAILABLE, Clock, Delays, Lifecycles

_REGION = re.compile(r"Credential=[^/]+/\d+/([^/]+)/")
_FORWARDED = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token", "User-Agent")

Key = tuple[str, str]


def region_of(headers: dict[str, str]) -> str:
    match = _REGION.search(headers.get("Authorization", ""))
    return match.group(1) if match else "us-east-1"


class EmulatorServer:
    """RDS in front of moto at ``moto_url``; ``faults``, ``log`` and ``lifecycles`` are the test's handles."""

    def __init__(self, moto_url: str, delays: Delays, clock: Clock) -> None:
        self.moto_url = moto_url
        self.lifecycles = Lifecycles(delays, clock)
        self.faults = Faults(clock)
        self.log = CallLog(clock)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._serial: asyncio.Lock | None = None
        self.port = 0

    async def start(self, port: int = 0) -> int:
        self._session = aiohttp.ClientSession()
        self._serial = asyncio.Lock()
        app = web.Application()
        app.router.add_post("/", self._rds)
        app.router.add_get("/_emulator/calls", self._calls)
        app.router.add_post("/_emulator/faults", self._faults)
        app.router.add_post("/_emulator/maintenance", self._maintenance)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- RDS ---------------------------------------------------------------------------------------------------------

    async def _rds(self, request: web.Request) -> web.Response:
        params = wire.parse_form(await request.read())
        headers = {k: request.headers[k] for k in _FORWARDED if k in request.headers}
        action = params.get("Action", "")
        instance = params.get("DBInstanceIdentifier", "").lower()
        fault = self.faults.check(action)
        if fault is not None:
            status, body = fault.status, fault.body()
        else:
            assert self._serial is not None
            async with self._serial:  # one call at a time: each sees the state the previous one left
                await self._finish_deletions()
                try:
                    status, body = await self._answer(action, params, headers)
                except wire.RdsError as exc:
                    status, body = exc.status, exc.body()
        error = wire.error_of(body) if status >= 400 else None
        self.log.record(action, instance, error.code if error else "ok", status)
        return web.Response(status=status, body=body, content_type="text/xml")

    async def _answer(self, action: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        if action == "ModifyDBInstance":
            return await self._modify(params, headers)
        if action == "DeleteDBInstance":
            return await self._delete(params, headers)
        status, body = await self.moto(params, headers)
        if status != 200 or action not in ("CreateDBInstance", "DescribeDBInstances", "DescribeDBSnapshots"):
            return status, body
        root = ET.fromstring(body)
        for snapshot in wire.snapshots(root):
            taking = self.lifecycles.snapshot_status(region_of(headers), wire.field(snapshot, "DBSnapshotIdentifier"))
            if taking is not None:
                wire.set_field(snapshot, "Status", taking)
        if action == "CreateDBInstance":
            self.lifecycles.created(self._key(headers, params["DBInstanceIdentifier"])).headers = headers
        for element in wire.instances(root):
            self._patch(element, headers)
        return status, ET.tostring(root)

    async def _modify(self, params: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        key = self._key(headers, params.get("DBInstanceIdentifier", ""))
        found = await self._current(key, headers)
        if found is None:
            return await self.moto(params, headers)  # moto answers DBInstanceNotFound as RDS does
        element, current = found
        plan = rules.plan_modify(params, current)
        record = self.lifecycles.adopted(key)
        record.headers = headers
        record.pending.update(plan.deferred)
        if plan.now:
            status, body = await self._apply(key, plan.now, headers)
            if status != 200:
                return status, body
            element = wire.instances(ET.fromstring(body))[0]
        self._patch(element, headers)
        return 200, wire.answer("ModifyDBInstance", element)

    async def _apply(self, key: Key, changes: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        """Applies ``changes`` in moto and starts the instance's ``modifying`` (then storage-optimization) steps."""
        call = {"Action": "ModifyDBInstance", "DBInstanceIdentifier": key[1], "ApplyImmediately": "true", **changes}
        if "EngineVersion" in changes:
            call["AllowMajorVersionUpgrade"] = "true"  # checked already by rules.plan_modify
        status, body = await self.moto(call, headers)
        if status == 200:
            self.lifecycles.modified(key, storage="AllocatedStorage" in changes)
        return status, body

    async def _delete(self, params: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        key = self._key(headers, params.get("DBInstanceIdentifier", ""))
        found = await self._current(key, headers)
        if found is None:
            return await self.moto({**params, "SkipFinalSnapshot": "true"}, headers)
        element, current = found
        if wire.is_true(wire.field(element, "DeletionProtection")):
            raise wire.RdsError(
                "InvalidParameterCombination",
                "Cannot delete protected DB Instance, please disable deletion protection and try again.",
            )
        snapshot = rules.final_snapshot(params, current)
        if snapshot is not None:
            # RDS takes the final snapshot as the deletion starts: DescribeDBSnapshots lists it from now on.
            snap = {"Action": "CreateDBSnapshot", "DBInstanceIdentifier": key[1], "DBSnapshotIdentifier": snapshot}
            status, body = await self.moto(snap, headers)
            if status != 200:
                return status, body
        self.lifecycles.deleting(key, headers, snapshot)
        self._patch(element, headers)
        return 200, wire.answer("DeleteDBInstance", element)

    async def _finish_deletions(self) -> None:
        for key, record in self.lifecycles.finished_deletions():
            call = {"Action": "DeleteDBInstance", "DBInstanceIdentifier": key[1], "SkipFinalSnapshot": "true"}
            await self.moto(call, record.headers)

    async def _current(self, key: Key, headers: dict[str, str]) -> tuple[ET.Element, rules.Current] | None:
        status, body = await self.moto({"Action": "DescribeDBInstances", "DBInstanceIdentifier": key[1]}, headers)
        if status != 200:
            return None
        element = wire.instances(ET.fromstring(body))[0]
        current = rules.Current(
            identifier=key[1],
            status=self.lifecycles.status(key) or wire.field(element, "DBInstanceStatus"),
            engine=wire.field(element, "Engine"),
            engine_version=wire.field(element, "EngineVersion"),
            storage=int(wire.field(element, "AllocatedStorage") or 0),
            storage_type=wire.field(element, "StorageType") or "gp2",
            storage_locked=self.lifecycles.storage_locked(key),
        )
        return element, current

    def _patch(self, element: ET.Element, headers: dict[str, str]) -> None:
        """Writes the emulator's status and pending modifications over moto's (moto's own ``stopped`` etc. stay)."""
        key = self._key(headers, wire.field(element, "DBInstanceIdentifier"))
        record = self.lifecycles.get(key)
        if record is None:
            return
        status = record.timeline.status(self.lifecycles.clock())
        if status != AVAILABLE:
            wire.set_field(element, "DBInstanceStatus", status)
        wire.set_pending(element, record.pending)

    async def maintenance(self, region: str, identifier: str) -> bool:
        """Runs the instance's maintenance window now: its pending modifications are applied. False if none were."""
        key = (region, identifier.lower())
        assert self._serial is not None
        async with self._serial:
            record = self.lifecycles.get(key)
            if record is None or not record.pending:
                return False
            changes, record.pending = record.pending, {}
            status, body = await self._apply(key, changes, record.headers)
            if status != 200:
                raise wire.error_of(body) or wire.RdsError("InternalFailure", body.decode(), status)
            return True

    async def moto(self, params: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        """One call to moto as it is (the Version is added if missing)."""
        assert self._session is not None
        body = wire.encode_form({"Version": wire.VERSION, **params})
        send = {**headers, "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
        async with self._session.post(f"{self.moto_url}/", data=body, headers=send) as response:
            return response.status, await response.read()

    @staticmethod
    def _key(headers: dict[str, str], identifier: str) -> Key:
        return region_of(headers), identifier.lower()

    # -- control API (for a standalone emulator; tests in-process use the objects directly) ----------------------------

    async def _calls(self, request: web.Request) -> web.Response:
        action = request.query.get("action")
        return web.json_response([c.as_dict() for c in self.log.calls(action)])

    async def _faults(self, request: web.Request) -> web.Response:
        """``{"throttle": N}``, ``{"throttle_above": rate, "burst": b}``, ``{"fail": N, "status": 503}``, ``{}`` clears;
        ``"action"`` narrows a one-shot fault to one action."""
        spec: dict[str, Any] = await request.json()
        action = spec.get("action")
        if "throttle" in spec:
            self.faults.throttle(int(spec["throttle"]), action)
        elif "throttle_above" in spec:
            self.faults.throttle_above(float(spec["throttle_above"]), spec.get("burst"))
        elif "fail" in spec:
            self.faults.fail(int(spec["fail"]), int(spec.get("status", 500)), action)
        else:
            self.faults.clear()
        return web.json_response({"ok": True})

    async def _maintenance(self, request: web.Request) -> web.Response:
        spec: dict[str, str] = await request.json()
        applied = await self.maintenance(spec.get("region", "us-east-1"), spec["DBInstanceIdentifier"])
        return web.json_response({"applied": applied})
