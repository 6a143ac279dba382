"""The PostgreSQL images per major come from the platform's configuration (KANRI_POSTGRES_IMAGES, set by the chart);
the pods the operator builds name exactly those references, digest included."""

from __future__ import annotations

import json

import pytest

from kanri.postgres.children.images import PostgresImages, tag_major
from kanri.postgres.children.rehearsal import rehearsal_pod
from kanri.postgres.children.statefulset import postgres_image, statefulset
from kanri.postgres.children.upgrade import check_pod, upgrade_pod
from tests.unit.test_postgres_builders import cluster, parsed

DIGEST = "sha256:" + "ab" * 32
CONFIG = {
    "postgres": {str(m): f"registry.example.com/kanri/kanri-postgres:{m}@{DIGEST}" for m in (15, 16)},
    "upgrade": {"16": f"registry.example.com/kanri/kanri-postgres-upgrade:16@{DIGEST}"},
}


def _image(pod: dict[str, object]) -> str:
    (container,) = pod["spec"]["containers"]  # type: ignore[index]
    return str(container["image"])


def test_the_configured_reference_of_each_major_is_used_and_others_keep_the_default() -> None:
    images = PostgresImages.from_environment({"KANRI_POSTGRES_IMAGES": json.dumps(CONFIG)})
    assert images.for_major(15) == f"registry.example.com/kanri/kanri-postgres:15@{DIGEST}"
    assert images.for_major(17) == "kanri.dev/postgres:17"
    assert images.for_upgrade(16) == f"registry.example.com/kanri/kanri-postgres-upgrade:16@{DIGEST}"
    assert images.for_upgrade(18) == "kanri.dev/postgres-upgrade:18"
    assert PostgresImages.from_environment({}) == PostgresImages()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ('{"postgres": {"15": "r/kanri-postgres:16@sha256:00"}}', "whose tag is not major 15"),
        ('{"postgres": {"15": "r/kanri-postgres@sha256:00"}}', "whose tag is not major 15"),
        ('{"postgres": {"fifteen": "r/p:15"}}', "must be a major"),
        ('{"pg": {}}', "must be an object"),
    ],
)
def test_a_configuration_that_would_lose_the_major_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PostgresImages.parse(text)


def test_the_major_is_read_from_the_tag_before_a_digest() -> None:
    assert tag_major(f"registry.example.com:5000/kanri/kanri-postgres:17@{DIGEST}") == 17
    assert tag_major(f"registry.example.com:5000/kanri/kanri-postgres:17.11@{DIGEST}") == 17
    assert tag_major(f"registry.example.com:5000/kanri/kanri-postgres@{DIGEST}") is None


def test_instances_rehearsals_and_upgrades_run_the_configured_images() -> None:
    images = PostgresImages.parse(json.dumps(CONFIG))
    owner = cluster(version=15)
    spec = parsed(owner)
    image = postgres_image(spec, 15, None, images)
    assert image == CONFIG["postgres"]["15"]
    sts = statefulset(owner, spec, "orders-1", role="primary", image=image, running=True)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == CONFIG["postgres"]["15"]
    # a pinned minor in the spec still wins over the platform's default
    pinned = parsed(cluster(version=15, imageName="kanri.dev/postgres:15.9"))
    assert postgres_image(pinned, 15, None, images) == "kanri.dev/postgres:15.9"
    assert _image(rehearsal_pod(owner, 16, "first", images=images)) == CONFIG["postgres"]["16"]
    assert _image(check_pod(owner, 15, 16, images=images)) == CONFIG["upgrade"]["16"]
    assert _image(upgrade_pod(owner, spec, "orders-1", 15, 16, images)) == CONFIG["upgrade"]["16"]
