"""The entry point of the local cluster's ``kanri.dev/seaweedfs`` image: the pod's S3 keys into SeaweedFS's identity
file, then ``weed mini`` in this process's place.

The key pair is read from the mounted Secret (:data:`kanri.local.seaweedfs.KEYS_DIR`) and written to a file of mode 0600
on the container's scratch emptyDir; only that file's path is on weed's command line. ``exec`` makes weed the
container's main process, so the kubelet's stop signal reaches it directly and a restart starts only after it has exited
(a weed started while the old one still holds its ports silently picks other ones). weed binds the pod's IP (``POD_IP``,
from the downward API) and creates the bucket at start (``-bucket``) if it does not exist yet. Its parts know each other
by the pod's host name (``-ip``; the pod's /etc/hosts maps it to the pod's IP), not by the IP: the master keeps the
volume server's address in its data, and a re-created pod has a new IP — with ``-ip=<IP>`` every upload after a restart
went to the old address and failed.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from kanri.local.seaweedfs import (
    ACCESS_KEY_ID_KEY,
    KEYS_DIR,
    S3_BUCKET,
    S3_PORT,
    SECRET_ACCESS_KEY_KEY,
    S3Keys,
    s3_config,
    weed_argv,
)


def write_identity(keys_dir: Path, target: Path) -> None:
    """The identity file for the keys in ``keys_dir``, created with mode 0600 (never readable by others)."""
    keys = S3Keys(
        (keys_dir / ACCESS_KEY_ID_KEY).read_text().strip(), (keys_dir / SECRET_ACCESS_KEY_KEY).read_text().strip()
    )
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(s3_config(keys))


def argv(weed: str, data: Path, config: Path, s3_port: int, name: str, ip: str, bucket: str) -> list[str]:
    """weed's command line: :func:`kanri.local.seaweedfs.weed_argv` known as ``name``, bound to ``ip``, the bucket
    to create at start, no admin UI."""
    return [*weed_argv(weed, data, config, s3_port, name, bind=ip), f"-bucket={bucket}", "-admin.ui=false"]


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kanri.local.s3server", description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", default=S3_BUCKET)
    parser.add_argument("--data", type=Path, default=Path("/data"))
    parser.add_argument("--s3-port", type=int, default=S3_PORT)
    parser.add_argument("--keys", type=Path, default=Path(KEYS_DIR))
    parser.add_argument("--identity-file", type=Path, default=Path("/tmp/s3-identities.json"))
    options = parser.parse_args(arguments)
    ip = os.environ.get("POD_IP")
    weed = os.environ.get("KANRI_WEED")
    if not ip or not weed:
        sys.exit("kanri.local.s3server needs POD_IP (the downward API's status.podIP) and KANRI_WEED (the weed binary)")
    options.data.mkdir(parents=True, exist_ok=True)
    write_identity(options.keys, options.identity_file)
    name = os.environ.get("POD_NAME") or socket.gethostname()  # stable across re-creation, in the pod's /etc/hosts
    command = argv(weed, options.data, options.identity_file, options.s3_port, name, ip, options.bucket)
    print("starting", " ".join(command), flush=True)  # paths and ports only: the keys are in the file
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
