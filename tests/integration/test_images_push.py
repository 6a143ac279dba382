"""``kanri images push`` against real registries (distribution, built by ``make registry-tools``): the local
cluster's TLS registry and a plain-HTTP one on a loopback address. What arrives has the layout's digests, and the
SBOM and signature are found again as the image's referrers."""

from __future__ import annotations

import dataclasses
import http.client
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kanri.cli.local import start_registry
from kanri.cli.main import app
from kanri.images.catalog import built_images, catalog_file, images_dir
from kanri.images.push import PushError, push_images, push_layout
from kanri.images.registry import Destination, Oras, RegistryClientError
from kanri.local import paths
from kanri.local.ports import free_port
from kanri.local.registry import LocalRegistry, RegistryEndpoint, registry_binary
from tests.unit.test_images_push import SBOM_TYPE, SIGNATURE_TYPE, Layout, make_layout, write_catalog

pytestmark = pytest.mark.skipif(
    not registry_binary().is_file(), reason="distribution's registry is not built (make registry-tools)"
)


@pytest.fixture
def tls_registry(tmp_path: Path) -> Iterator[RegistryEndpoint]:
    registry = LocalRegistry(tmp_path / "cluster")
    endpoint = registry.start()
    yield endpoint
    registry.stop()


@pytest.fixture
def plain_registry(tmp_path: Path) -> Iterator[str]:
    """distribution serving plain HTTP on a loopback port: ``127.0.0.1:<port>``."""
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "plain.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn", "accesslog": {"disabled": True}},
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "plain-data")}},
                "http": {"addr": address},
            }
        )
    )
    with (tmp_path / "plain.log").open("wb") as log:
        process = subprocess.Popen(
            [str(registry_binary()), "serve", str(config)],
            stdout=log,
            stderr=log,
            env=os.environ | {"OTEL_TRACES_EXPORTER": "none"},
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection(address, timeout=2)
                conn.request("GET", "/v2/")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "plain.log").read_text()
            assert time.monotonic() < deadline, "the plain-HTTP registry did not answer /v2/ within 30 s"
            time.sleep(0.1)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)


def _assert_arrived(oras: Oras, dest: Destination, repository: str, layout: Layout, *, cosign: bool = False) -> None:
    full = dest.repository(repository)
    assert oras.resolve(f"{full}:{layout.tag}", dest) == layout.digest
    referrers = {r.digest: r.artifact_type for r in oras.referrers(f"{full}@{layout.digest}", dest)}
    if cosign:  # the signature where cosign verify looks for it
        assert referrers == {layout.sbom_digest: SBOM_TYPE}
        signature_tag = layout.digest.replace(":", "-") + ".sig"
        assert oras.resolve(f"{full}:{signature_tag}", dest) == layout.signature_digest
    else:
        assert referrers == {layout.sbom_digest: SBOM_TYPE, layout.signature_digest: SIGNATURE_TYPE}


def test_an_image_reaches_the_local_tls_registry_with_its_sbom_and_signature(
    tls_registry: RegistryEndpoint, tmp_path: Path
) -> None:
    layout = make_layout(tmp_path / "layout", tag="17")
    dest = Destination(tls_registry.address, "kanri", ca_file=tls_registry.ca_file)
    oras = Oras()
    pushed = push_layout(oras, layout.path, "kanri-postgres", dest)
    assert [p.reference for p in pushed] == [f"{tls_registry.address}/kanri/kanri-postgres@{layout.digest}"]
    _assert_arrived(oras, dest, "kanri-postgres", layout)
    # a second push changes nothing
    assert push_layout(oras, layout.path, "kanri-postgres", dest) == pushed
    _assert_arrived(oras, dest, "kanri-postgres", layout)


def test_the_local_registry_is_not_trusted_without_its_ca(tls_registry: RegistryEndpoint, tmp_path: Path) -> None:
    layout = make_layout(tmp_path / "layout")
    with pytest.raises(RegistryClientError, match=r"certificate"):
        push_layout(Oras(), layout.path, "kanri-operator", Destination(tls_registry.address))


def test_the_local_registry_keeps_its_port_and_ca_across_restarts(tmp_path: Path) -> None:
    registry = LocalRegistry(tmp_path / "cluster")
    first = registry.start()
    ca = first.ca_file.read_bytes()
    assert registry.start().pid == first.pid  # idempotent
    registry.stop()
    try:
        second = registry.start()
        assert (second.address, second.ca_file.read_bytes()) == (first.address, ca)
        assert second.pid != first.pid
        assert (registry.pki_dir / "ca.key").stat().st_mode & 0o077 == 0
    finally:
        registry.stop()


def test_kanri_images_push_copies_every_image_to_a_plain_http_loopback_registry(
    plain_registry: str, tmp_path: Path
) -> None:
    operator = make_layout(tmp_path / "operator", tag="0.1.0", content=b"operator layer", cosign=True)
    postgres = make_layout(tmp_path / "postgres", tag="17", content=b"postgres layer")
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    write_catalog(catalog, "kanri-operator", operator)
    images = built_images(catalog)
    # two images in one catalog: the helper writes one entry, so add the second by hand
    write_catalog(tmp_path, "kanri-postgres", postgres)
    images += built_images(tmp_path)
    dest = Destination.parse(f"{plain_registry}/platform", plain_http=True)
    pushed = push_images(Oras(), images, dest)
    assert {p.reference for p in pushed} == {
        f"{plain_registry}/platform/kanri-operator@{operator.digest}",
        f"{plain_registry}/platform/kanri-operator@{operator.signature_digest}",  # under cosign's tag
        f"{plain_registry}/platform/kanri-postgres@{postgres.digest}",
    }
    _assert_arrived(Oras(), dest, "kanri-operator", operator, cosign=True)
    _assert_arrived(Oras(), dest, "kanri-postgres", postgres)

    result = CliRunner().invoke(
        app, ["images", "push", "--to", f"{plain_registry}/cli", "--plain-http", "--images", str(catalog)]
    )
    assert result.exit_code == 0, result.output
    assert f"{plain_registry}/cli/kanri-operator@{operator.digest}" in result.output
    cli_dest = Destination.parse(f"{plain_registry}/cli", plain_http=True)
    _assert_arrived(Oras(), cli_dest, "kanri-operator", operator, cosign=True)


def test_a_push_fails_when_the_catalog_names_a_signature_that_did_not_arrive(
    plain_registry: str, tmp_path: Path
) -> None:
    layout = make_layout(tmp_path / "operator", tag="0.1.0")
    write_catalog(tmp_path, "kanri-operator", layout)
    (image,) = built_images(tmp_path)
    other = "sha256:" + "0" * 64  # a signature the layout does not hold
    stale = dataclasses.replace(image, signature_digest=other)
    with pytest.raises((PushError, RegistryClientError), match=other.removeprefix("sha256:")[:12]):
        push_images(Oras(), [stale], Destination(plain_registry, "p", plain_http=True))


def test_a_pushed_operator_image_verifies_with_cosign_against_the_platform_key(
    plain_registry: str, tmp_path: Path
) -> None:
    """The real built image (make images): after the push, cosign finds its signature where it looks and verifies it
    with the platform's public key — what docs/install.md tells a cluster's owner to run."""
    cosign, key = paths.build_dir() / "bin" / "cosign", images_dir() / "signing.pub"
    if not catalog_file().is_file() or not cosign.is_file() or not key.is_file():
        pytest.fail("no signed images: run `make images` (part of `make setup`)")
    (operator,) = [image for image in built_images() if image.name == "kanri-operator"]
    dest = Destination(plain_registry, "verify", plain_http=True)
    (pushed, *_) = push_layout(Oras(), operator.layout, operator.repository, dest)
    assert pushed.digest == operator.digest
    result = subprocess.run(
        [
            str(cosign),
            "verify",
            "--key",
            str(key),
            "--insecure-ignore-tlog=true",
            "--allow-http-registry",
            pushed.reference,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert operator.digest in result.stdout


def test_kanri_local_up_starts_the_registry_and_pushes_the_built_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `kanri local up` does after the nodes: the cluster's registry, then the catalog pushed into it."""
    build = tmp_path / "build"
    (build / "images").mkdir(parents=True)
    (build / "bin").mkdir()
    for tool in ("oras", "registry"):  # the real tools, from this checkout's build dir
        (build / "bin" / tool).symlink_to(paths.build_dir() / "bin" / tool)
    layout = make_layout(build / "images" / "kanri-operator", tag="0.1.0", cosign=True)
    write_catalog(build / "images", "kanri-operator", layout)
    monkeypatch.setenv("KANRI_BUILD_DIR", str(build))
    monkeypatch.setenv("KANRI_HOME", str(tmp_path / "home"))
    registry = LocalRegistry(paths.cluster_dir("images-test"))
    try:
        start_registry("images-test")
        assert registry.running_pid() is not None
        dest = Destination(registry.address, "kanri", ca_file=registry.ca_file)
        _assert_arrived(Oras(), dest, "kanri-operator", layout, cosign=True)
    finally:
        registry.stop()
