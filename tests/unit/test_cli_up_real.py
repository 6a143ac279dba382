"""``kanri up --real-nodes``' manifests: every image named as the real nodes know it, never pulled."""

from __future__ import annotations

import json
from pathlib import Path

from kanri.cli import up_real
from kanri.cli.up import documents, with_default_repository
from kanri.local import paths
from kanri.local.seaweedfs import SEAWEEDFS_IMAGE, object_store
from kanri.postgres.children.images import ENV as POSTGRES_IMAGES_ENV


def test_kanri_images_are_named_as_the_nodes_imported_them() -> None:
    assert up_real.node_image("kanri.dev/kanri-postgres:15") == "kanri.local/kanri-postgres:15"
    assert up_real.node_image("kanri.dev/kanri-operator:0.1.0") == "kanri.local/kanri-operator:0.1.0"
    # the local name of the object store's image differs from its built repository
    assert up_real.node_image(SEAWEEDFS_IMAGE) == "kanri.local/kanri-seaweedfs:4.48"


def test_the_operator_and_its_table_of_postgres_images_name_node_images_never_pulled() -> None:
    root = paths.source_root()
    given = with_default_repository(documents(root / "deploy" / "operator"))
    docs = up_real.on_real_nodes(given)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "kanri.local/kanri-operator:0.1.0"
    assert container["imagePullPolicy"] == "Never"
    table = json.loads(next(e["value"] for e in container["env"] if e["name"] == POSTGRES_IMAGES_ENV))
    assert table["postgres"]["15"] == "kanri.local/kanri-postgres:15"
    assert table["upgrade"]["16"] == "kanri.local/kanri-postgres-upgrade:16"
    every = [image for by_major in table.values() for image in by_major.values()]
    assert all(image.startswith("kanri.local/") for image in every), every
    # what it was given is left as it was (the home-made node's kanri up applies the same documents)
    (before,) = [d for d in given if d["kind"] == "Deployment"]
    assert before["spec"]["template"]["spec"]["containers"][0]["image"].startswith("kanri.dev/")


def test_the_object_store_runs_its_built_image_and_the_example_imports_its_major() -> None:
    (_, stateful_set) = up_real.on_real_nodes(object_store("kanri-system"))
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == ("kanri.local/kanri-seaweedfs:4.48", "Never")
    example = documents(Path(paths.source_root()) / "examples" / "postgrescluster.yaml")[0]
    assert up_real.images_for(example) == (
        "kanri-operator",
        "kanri-seaweedfs",
        f"kanri-postgres-{example['spec']['version']}",
    )
