"""``liveloop learner ...``: operating the learner (the lead mounts :data:`app` on the main CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from liveloop.exit_codes import LiveloopGroup

app = typer.Typer(help="The continuous learner.", no_args_is_help=True, add_completion=False, cls=LiveloopGroup)


@app.callback()
def learner() -> None:
    """The continuous learner (a group of commands, even while it has one)."""


@app.command("init-base")
def init_base(
    tiny: Annotated[bool, typer.Option("--tiny", help="Build the tiny Llama from learner.tiny_model.")] = False,
    source: Annotated[
        Path | None, typer.Option("--from", help="Copy this local Hugging Face model folder as the base.")
    ] = None,
    model_name: Annotated[str | None, typer.Option("--model-name", help="MLflow registered model name.")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="The learner's data folder.")] = None,
    register: Annotated[bool, typer.Option(help="Register it in MLflow as version 1, alias champion.")] = True,
) -> None:
    """Create the base model (version 1) with its manifest, and register it as version 1 of a fresh registered
    model (the first champion); a model that already holds versions is refused (use another --model-name)."""
    from learner.checkpoint import write_base_checkpoint
    from learner.settings import LearnerSettings

    if tiny == (source is not None):
        raise typer.BadParameter("give exactly one of --tiny or --from FOLDER")
    if source is not None and not (source / "config.json").is_file():
        raise typer.BadParameter(f"{source} is not a Hugging Face model folder (no config.json)")
    settings = LearnerSettings()
    settings = settings.model_copy(
        update={"model_name": model_name or settings.model_name, "data_dir": data_dir or settings.data_dir}
    )
    folder = write_base_checkpoint(settings.data_dir, settings.model_name, source)
    typer.echo(f"base model: {folder}")
    if not register:
        return
    from learner.publish import register_base

    if settings.publishes:
        dsn = settings.dsn.get_secret_value() if settings.dsn else ""
        mlflow_uri = settings.mlflow_uri or ""
    else:  # the folder's running stack (`liveloop up`, or a kept-running demo), whose keys it reads
        from infra.active import resolve_stack_settings
        from infra.stack import Stack

        endpoints = Stack(resolve_stack_settings(), create_credentials=False).endpoints
        dsn, mlflow_uri = endpoints.dsn(), endpoints.mlflow_url
    version = register_base(folder, mlflow_uri=mlflow_uri, dsn=dsn)
    typer.echo(f"registered {settings.model_name} version {version} (alias champion if it had none)")
