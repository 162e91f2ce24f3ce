"""``potluck sim``: the swarm simulator (docs/sim.md). Its options are ``potluck.sim.__main__``'s, passed
through unchanged, so ``potluck sim ...`` and ``python -m potluck.sim ...`` are one command."""

from __future__ import annotations

import typer

SIM_HELP = (
    "Simulate a swarm of up to 10,000 volunteers with churn, the real planner deciding: "
    "`potluck sim run|dht|replay --help`."
)


def register(app: typer.Typer) -> None:
    @app.command(
        "sim",
        help=SIM_HELP,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,  # --help goes to the simulator's own parser, which knows its options
    )
    def sim(ctx: typer.Context) -> None:
        from potluck.sim.__main__ import main

        raise typer.Exit(main(list(ctx.args) or ["--help"], prog="potluck sim"))
