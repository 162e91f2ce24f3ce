"""The ``potluck`` console script: one typer app, one module per subcommand.

Each ``*_cmd`` module exposes ``register(app)``; this file only wires them and sets up logging, so entry
points stay thin and the work lives in the packages. Command modules import torch, hivemind and the
packages built on them inside their command bodies: ``potluck --help`` must not wait for them.
"""

from __future__ import annotations

import importlib

import typer

from potluck import __version__, logs
from potluck.cli.common import fail
from potluck.compat import use_fork
from potluck.errors import PotluckError

# Subcommand modules, in the order `potluck --help` lists them.
COMMANDS: tuple[str, ...] = (
    "potluck.cli.peer_cmd",
    "potluck.cli.launch_cmd",
    "potluck.cli.access_cmd",
    "potluck.cli.status_cmd",
    "potluck.cli.monitor_cmd",
    "potluck.cli.demo_cmd",
    "potluck.cli.plan_cmd",
    "potluck.cli.generate_cmd",
    "potluck.cli.export_cmd",
    "potluck.cli.serve_cmd",
    "potluck.cli.testbed_cmd",
    "potluck.cli.sim_cmd",
)

app = typer.Typer(
    name="potluck",
    help="Decentralized volunteer training: bring your GPU to the pot.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"potluck {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True, help="-v info, -vv debug; else POTLUCK_LOGLEVEL, default warning."
    ),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print version."),
) -> None:
    logs.configure(verbose)  # also POTLUCK_LOGFORMAT=json; hivemind's records follow the same level


for _module in COMMANDS:
    importlib.import_module(_module).register(app)


def main() -> None:
    use_fork()  # before anything creates a hivemind process object (see potluck.compat)
    try:
        app()
    except PotluckError as e:  # the one type the CLI catches: its message says what to do
        raise SystemExit(fail(str(e), code=1).exit_code) from None
