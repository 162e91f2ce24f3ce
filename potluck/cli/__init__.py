"""The ``potluck`` console script: one typer app, one module per subcommand.

Each ``*_cmd`` module exposes ``register(app)``; this file only wires them and sets up logging, so entry
points stay thin and the work lives in the packages.
"""

from __future__ import annotations

import importlib
import logging

import typer

from potluck import __version__
from potluck.compat import use_fork

# Subcommand modules, in the order `potluck --help` lists them.
COMMANDS: tuple[str, ...] = (
    "potluck.cli.peer_cmd",
    "potluck.cli.launch_cmd",
    "potluck.cli.status_cmd",
    "potluck.cli.demo_cmd",
    "potluck.cli.plan_cmd",
    "potluck.cli.generate_cmd",
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
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More logging (-v info, -vv debug)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print version."),
) -> None:
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # hivemind configures its own handlers; keep its chatter at our level.
    logging.getLogger("hivemind").setLevel(max(level, logging.INFO) if verbose < 2 else logging.DEBUG)


for _module in COMMANDS:
    importlib.import_module(_module).register(app)


def main() -> None:
    use_fork()  # before anything creates a hivemind process object (see potluck.compat)
    app()
