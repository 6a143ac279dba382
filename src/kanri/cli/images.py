"""``kanri images``: copy the images ``make images`` built (with their SBOMs and signatures) to a registry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kanri.images.catalog import built_images, images_dir
from kanri.images.chart import package_chart
from kanri.images.push import PushError, push_images
from kanri.images.registry import Destination, Oras, RegistryClientError
from kanri.local import paths
from kanri.local.detached import DetachedProcessError
from kanri.local.registry import LocalRegistry

app = typer.Typer(no_args_is_help=True, help="kanri's container images (built by `make images`).")
err = Console(stderr=True, soft_wrap=True)


def local_destination(name: str) -> Destination:
    """The local cluster ``name``'s registry (started when it is not running), trusted through its CA."""
    endpoint = LocalRegistry(paths.cluster_dir(name)).start()
    return Destination(endpoint.address, "kanri", ca_file=endpoint.ca_file)


@app.command()
def push(
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="REGISTRY[/PREFIX], e.g. registry.example.com/platform: each image goes to "
            "REGISTRY/PREFIX/<repository>.",
        ),
    ] = None,
    local: Annotated[
        str | None, typer.Option("--local", help="Push to this local cluster's registry instead (started if needed).")
    ] = None,
    plain_http: Annotated[
        bool, typer.Option("--plain-http", help="Speak HTTP, not HTTPS (a test registry on a loopback address).")
    ] = False,
    ca_file: Annotated[Path | None, typer.Option("--ca-file", help="Trust this CA for the registry.")] = None,
    registry_config: Annotated[
        Path | None,
        typer.Option(
            "--registry-config",
            help="Docker config with the registry's credentials (default: "
            "~/.docker/config.json; `oras login` writes it).",
        ),
    ] = None,
    images: Annotated[
        Path | None, typer.Option("--images", help="Folder of images.json (default .build/images).")
    ] = None,
    if_running: Annotated[
        bool, typer.Option("--if-running", help="With --local: do nothing unless that registry already runs.")
    ] = False,
) -> None:
    """Copy every built image, its SBOM and its signature to a registry, keeping their digests; print each
    image's pull reference (REPOSITORY@DIGEST, what the chart names)."""
    if (to is None) == (local is None):
        err.print("[red]error:[/red] give exactly one of --to REGISTRY/PREFIX and --local NAME")
        raise typer.Exit(2)
    if local is not None and if_running and LocalRegistry(paths.cluster_dir(local)).running_pid() is None:
        err.print(f"local cluster {local!r} has no running registry: nothing pushed (`kanri local up` pushes)")
        return
    try:
        dest = (
            local_destination(local)
            if local is not None
            else Destination.parse(str(to), plain_http=plain_http, ca_file=ca_file)
        )
        catalog = built_images(images)
        oras = Oras(registry_config=registry_config)
        with err.status(f"pushing {len(catalog)} image(s) to {dest}"):
            pushed = push_images(oras, catalog, dest)
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/red] no built images in {images or images_dir()} ({exc}); run `make images`")
        raise typer.Exit(1) from exc
    except (ValueError, PushError, RegistryClientError, DetachedProcessError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    for image in pushed:
        typer.echo(f"{image.repository}:{image.tag or '-'}\t{image.reference}")


@app.command()
def chart(
    out: Annotated[Path, typer.Option("--out", help="Folder of the package.")] = Path(".build/images/chart"),
    chart_dir: Annotated[Path, typer.Option("--chart", help="The chart folder.")] = Path("deploy/helm/kanri"),
    images: Annotated[
        Path | None, typer.Option("--images", help="Folder of images.json (default .build/images).")
    ] = None,
) -> None:
    """Package the Helm chart with the built images' digests (its digests.yaml); print the package's path."""
    try:
        package = package_chart(chart_dir, built_images(images), out)
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/red] {exc}; run `make images` first (and run this from the checkout)")
        raise typer.Exit(1) from exc
    typer.echo(str(package))
