"""The Kafka broker's image (kanri-kafka, issue 30) as images/images.toml declares it: the local node's user and
program, the Kafka version its pom pins, a launcher that needs nothing but the standard library (the image has no
Python dependencies), and a jars layer that holds exactly the pinned jars — a build with any other jar is refused.

The image built and run: tests/integration/test_images_run.py.
"""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from kanri.images import layers
from kanri.images.build import kafka_version
from kanri.local.imagemap import BUILT_REPOSITORIES, KAFKA_IMAGE, KAFKA_UID, kafka_entries

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
EPOCH = 1_796_515_200


def _definitions() -> dict[str, Any]:
    return tomllib.loads((IMAGES / "images.toml").read_text())


def test_the_image_runs_the_broker_launcher_as_the_kafka_user_the_local_node_uses() -> None:
    kafka = _definitions()["kafka"]
    assert kafka["repository"] == BUILT_REPOSITORIES[KAFKA_IMAGE]
    assert kafka["user"] == f"{KAFKA_UID}:{KAFKA_UID}"
    users = {user["name"]: user for user in _definitions()["user"]}
    assert users["kafka"]["uid"] == KAFKA_UID
    assert kafka["entrypoint"] == ["/usr/bin/python3", "-m", "kanri.kafka.broker"]
    # the home-made node runs the same module (with the host's python3 and java)
    for entry in kafka_entries("/usr/bin/python3", {}):
        assert entry["command"][1:] == kafka["entrypoint"][1:]


def test_the_tag_is_the_kafka_version_the_pom_pins_and_the_local_node_serves() -> None:
    version = kafka_version(IMAGES / "kafka" / "pom.xml")
    assert version == "4.4.0"
    assert f"kafka-clients-{version}.jar" in layers.read_jar_pins(IMAGES / "kafka" / "jars.sha256")
    for entry in kafka_entries("/usr/bin/python3", {}):
        assert entry["image"] == f"{KAFKA_IMAGE}:{version}"


def test_java_is_a_locked_debian_package_at_the_path_the_image_names() -> None:
    definitions = _definitions()
    assert "openjdk-17-jre-headless" in definitions["kafka"]["debian"]
    assert set(definitions["kafka"]["debian"]) <= set(definitions["debian"]["include"])
    lock = (IMAGES / "debian.lock").read_text()
    assert "\nopenjdk-17-jre-headless " in lock
    assert definitions["kafka"]["java"] == "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"


def test_the_broker_launcher_imports_with_the_standard_library_alone() -> None:
    # -S: no site-packages (the image has no Python dependencies); -I would drop the path to src as well
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import kanri.kafka.broker.launch; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] not in {*sys.stdlib_module_names, '__main__'}))"
    )
    done = subprocess.run(
        ["/usr/bin/python3", "-S", "-c", code, str(ROOT / "src")], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == str(["kanri", "kanri.kafka", "kanri.kafka.broker", "kanri.kafka.broker.launch",
                                       "kanri.kafka.broker.settings"])  # fmt: skip


def _jars(tmp_path: Path, names: dict[str, bytes]) -> tuple[Path, Path]:
    libs = tmp_path / "libs"
    libs.mkdir()
    for name, content in names.items():
        (libs / name).write_bytes(content)
    pins = tmp_path / "jars.sha256"
    pins.write_text("".join(f"{hashlib.sha256(c).hexdigest()}  {n}\n" for n, c in sorted(names.items())))
    return libs, pins


JARS = {"kafka-clients-4.4.0.jar": b"PK clients", "kafka_2.13-4.4.0.jar": b"PK server"}


def test_the_jars_layer_holds_exactly_the_pinned_jars_under_opt_kafka_libs(tmp_path: Path) -> None:
    libs, pins = _jars(tmp_path, JARS)
    layer = layers.jars_layer(layers.LayerCache(tmp_path / "cache"), libs, pins, EPOCH)
    with tarfile.open(layer.path) as tar:
        files = {m.name: m for m in tar.getmembers() if m.isfile()}
        assert set(files) == {f"{layers.KAFKA_LIBS}/{name}" for name in JARS}
        for name, content in JARS.items():
            member = files[f"{layers.KAFKA_LIBS}/{name}"]
            assert tar.extractfile(member).read() == content  # type: ignore[union-attr]
            assert (member.uid, member.mtime, member.mode & 0o444) == (0, EPOCH, 0o444)
    again = layers.jars_layer(layers.LayerCache(tmp_path / "other"), libs, pins, EPOCH)
    assert again.digest == layer.digest


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda libs: (libs / "kafka_2.13-4.4.0.jar").write_bytes(b"PK patched"), "kafka_2.13-4.4.0.jar's sha256"),
        (lambda libs: (libs / "evil-1.0.jar").write_bytes(b"PK"), "evil-1.0.jar is not pinned"),
        (lambda libs: (libs / "kafka-clients-4.4.0.jar").unlink(), "kafka-clients-4.4.0.jar is missing"),
    ],
)
def test_a_build_with_a_jar_other_than_the_pins_is_refused_even_from_the_cache(
    tmp_path: Path, change: Any, reason: str
) -> None:
    libs, pins = _jars(tmp_path, JARS)
    cache = layers.LayerCache(tmp_path / "cache")
    layers.jars_layer(cache, libs, pins, EPOCH)
    change(libs)
    with pytest.raises(RuntimeError, match=reason):
        layers.jars_layer(cache, libs, pins, EPOCH)


def test_no_jars_at_all_asks_for_make_kafka_dist(tmp_path: Path) -> None:
    _, pins = _jars(tmp_path, JARS)
    with pytest.raises(RuntimeError, match="make kafka-dist"):
        layers.jars_layer(layers.LayerCache(tmp_path / "cache"), tmp_path / "absent", pins, EPOCH)


def test_a_malformed_pin_line_is_refused(tmp_path: Path) -> None:
    pins = tmp_path / "jars.sha256"
    pins.write_text("abc kafka.jar\n")
    with pytest.raises(ValueError, match="expected"):
        layers.read_jar_pins(pins)
