"""``python -m tests.rds_emulator --port N``: the emulator as a process, for benchmarks and out-of-process operators."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from .lifecycle import Delays
from .moto_process import MotoProcess
from .server import EmulatorServer


async def _serve(port: int, delays: Delays) -> None:
    moto = MotoProcess()
    moto.start()
    server = EmulatorServer(moto.url, delays, time.monotonic)
    try:
        bound = await server.start(port)
        print(f"RDS emulator on http://127.0.0.1:{bound} (moto on {moto.url})", flush=True)
        await asyncio.Event().wait()
    finally:
        await server.close()
        moto.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    defaults = Delays()
    for name in ("creating", "backing_up", "modifying", "storage_optimization", "storage_cooldown", "deleting"):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=float, default=getattr(defaults, name), help="seconds in that status")
    args = parser.parse_args()
    delays = Delays(
        args.creating, args.backing_up, args.modifying, args.storage_optimization, args.storage_cooldown, args.deleting
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, delays))


if __name__ == "__main__":
    main()
