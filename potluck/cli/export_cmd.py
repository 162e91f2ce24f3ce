"""``potluck export``: a job's checkpoint as a Hugging Face model directory ``transformers`` loads."""

from __future__ import annotations

from pathlib import Path

import typer

from potluck.cli.common import fail
from potluck.cli.generate_cmd import resolve_checkpoint
from potluck.errors import PotluckError

DTYPES = ("float32", "bfloat16", "float16")


def _export(
    checkpoint: Path = typer.Argument(
        ..., help="Checkpoint root (newest complete step) or a step-NNNNNNNN dir."
    ),
    out: Path = typer.Argument(..., help="Directory to write (created; files in it are replaced)."),
    dtype: str = typer.Option(
        "float32", "--dtype", help="Weights as float32 (as trained), bfloat16 or float16."
    ),
    tokenizer_file: Path | None = typer.Option(
        None, "--tokenizer", help="The job's tokenizer.json (default: the one kept with the checkpoints)."
    ),
) -> None:
    """Write config.json, the weights (safetensors) and the tokenizer: AutoModelForCausalLM loads it."""
    if dtype not in DTYPES:
        raise fail(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    import torch  # here only: `potluck --help` must not wait for it

    from potluck.model.hub.convert import export_checkpoint

    try:
        ref = resolve_checkpoint(checkpoint)
        done = export_checkpoint(ref, out, getattr(torch, dtype), tokenizer_file=tokenizer_file)
    except (PotluckError, ValueError, OSError) as e:
        raise fail(str(e)) from None
    tied = " (head tied to the embedding)" if done.tied else ""
    typer.echo(f"step {done.step}: {done.n_params:,} parameters{tied} -> {out}: {', '.join(done.files)}")


def register(app: typer.Typer) -> None:
    app.command("export")(_export)
