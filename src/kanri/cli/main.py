"""Entry point of the ``kanri`` command."""

from __future__ import annotations

import typer

from kanri import __version__
from kanri.cli import backup, crds, images, local, operations, run, status, up
from kanri.cli import cache as cache_cli  # cache operator (issue 31)
from kanri.cli import cloud as cloud_cli  # cloud operator (issue 32)
from kanri.cli import kafka as kafka_cli  # kafka operator (issue 30)
from kanri.cli.convert import convert as convert_command  # issue 28: offline API version conversion
from kanri.cli.psql import psql_command  # issue 29 item 7: kanri psql CLUSTER

app = typer.Typer(no_args_is_help=True, help="kanri: Kubernetes operators in Python, and a PostgreSQL operator.")
app.add_typer(local.app, name="local")
app.add_typer(images.app, name="images")
app.add_typer(kafka_cli.app, name="kafka")  # kafka operator (issue 30)
app.add_typer(cache_cli.app, name="cache")  # cache operator (issue 31)
app.add_typer(cloud_cli.app, name="cloud")  # cloud operator (issue 32)
app.command("crds")(crds.crds)
app.command("convert")(convert_command)  # issue 28
app.command("run")(run.run)
app.command("status")(status.status)
app.command("up")(up.up)
app.command("promote")(operations.promote_command)
app.command("restart")(operations.restart_command)
app.command("restore-test")(operations.restore_test_command)
app.command("backup")(backup.backup_command)
app.command("hibernate")(operations.hibernate_command)
app.command("wake")(operations.wake_command)
app.command("psql")(psql_command)  # issue 29 item 7


@app.command()
def version() -> None:
    """Print kanri's version."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
