"""The e2e secret scan (tests/e2e/secret_scan.py) finds a Secret's value where it leaked — also after the Secret is
gone — names the place and the key, and never prints the value; usernames and certificates are not secrets."""

from __future__ import annotations

import base64
from pathlib import Path

from kanri.runtime import Client
from kanri.runtime.kinds import CONFIG_MAP, SECRET
from tests.e2e.secret_scan import SecretScan
from tests.support import eventually

PASSWORD = "s3cr3t-" + "x" * 20


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_a_leaked_password_is_found_by_place_never_shown(client: Client, namespace: str, tmp_path: Path) -> None:
    scan = SecretScan(client, namespace)
    await scan.start()
    secret = {"metadata": {"name": "orders-app", "namespace": namespace}, "type": "kubernetes.io/basic-auth",
              "data": {"username": b64("orders-owner"), "password": b64(PASSWORD)}}  # fmt: skip
    await client.create(SECRET, secret)
    await client.create(
        CONFIG_MAP, {"metadata": {"name": "harmless", "namespace": namespace}, "data": {"user": "orders-owner"}}
    )
    await client.create(
        CONFIG_MAP, {"metadata": {"name": "leaky", "namespace": namespace}, "data": {"conf": f"password={PASSWORD}"}}
    )

    async def remembered() -> list[str]:
        return list(scan.values.values())  # where from, never the values (a timeout message would print them)

    assert await eventually(remembered) == ["secret/orders-app:password"]  # the username is no secret
    await client.delete(SECRET, "orders-app", namespace)  # remembered from the watch, not from a final list
    log = tmp_path / "node" / "pods" / f"{namespace}_p_uid" / "c" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"connecting with {PASSWORD}\n")
    await scan.stop()

    found = await scan.findings(tmp_path, [("the test's stdout", "nothing here"), ("stderr", PASSWORD[:-1])])

    assert sorted(found) == sorted([
        "secret/orders-app:password found in ConfigMap leaky",
        f"secret/orders-app:password found in {log.relative_to(tmp_path)}",
    ])  # fmt: skip
    assert not [f for f in found if PASSWORD in f]
