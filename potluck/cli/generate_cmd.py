"""``potluck generate``: sample text from a job's checkpoint, to see what the swarm has learned."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer

from potluck.cli.common import fail
from potluck.errors import PotluckError
from potluck.protocol.checkpoints import CheckpointRef, check_step, latest_complete

logger = logging.getLogger(__name__)


def resolve_checkpoint(checkpoint: Path) -> CheckpointRef:
    """A step directory is used as given; anything else is a root searched for its newest complete step."""
    if checkpoint.name.startswith("step-") and checkpoint.is_dir():
        return check_step(checkpoint)
    if not checkpoint.is_dir():
        raise fail(f"checkpoint directory {checkpoint} does not exist")
    ref = latest_complete(checkpoint)
    if ref is None:
        raise fail(
            f"no complete checkpoint under {checkpoint} (every stage needs its .json and .safetensors)"
        )
    return ref


def _generate(
    checkpoint: Path = typer.Argument(
        ..., help="Checkpoint root (newest complete step) or a step-NNNNNNNN dir."
    ),
    prompt: str = typer.Option(..., "--prompt", "-p", help="Text to continue."),
    max_tokens: int = typer.Option(200, "--max-tokens", min=0, help="Tokens to add after the prompt."),
    temperature: float = typer.Option(0.8, "--temperature", min=0.0, help="0 = greedy (always the argmax)."),
    top_k: int = typer.Option(40, "--top-k", min=0, help="Sample among the k likeliest tokens; 0 = all."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed; same seed, same text."),
    tokenizer_file: Path | None = typer.Option(
        None, "--tokenizer", help="The job's tokenizer.json (default: the one kept with the checkpoints)."
    ),
) -> None:
    """Print the prompt and the model's continuation, from the newest complete checkpoint."""
    from potluck.model.sampling import generate, load_checkpoint_tokenizer, load_model  # torch: here only

    try:
        ref = resolve_checkpoint(checkpoint)
        stages, _spec, meta = load_model(ref)
        tokenizer = load_checkpoint_tokenizer(meta, ref.root, tokenizer_file)
        prompt_ids = tokenizer.encode(prompt)
        start = time.monotonic()
        new_ids = generate(stages, prompt_ids, max_tokens, temperature, top_k or None, seed)
    except (PotluckError, ValueError) as e:  # damage, tokenizer (DataError), a bad prompt
        raise fail(str(e)) from None
    logger.info("step %d: %d tokens in %.2f s", ref.step, len(new_ids), time.monotonic() - start)
    typer.echo(tokenizer.decode(prompt_ids + new_ids))


def register(app: typer.Typer) -> None:
    app.command("generate")(_generate)
