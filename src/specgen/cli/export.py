"""`specgen export vllm|llama.cpp`: a profile as another engine's command line."""

from __future__ import annotations

import typer

from specgen.cli.options import PROFILE
from specgen.profiles import load_profile

app = typer.Typer(
    help="Print the command line that serves a profile on vLLM or llama.cpp.\n\n"
    "`vllm serve` with --speculative-config, or `llama-server` with the draft's flags. Comments "
    "above the command say what the engine does differently; a profile it has no equivalent "
    "for gets one line saying so. Nothing is loaded or downloaded.",
    no_args_is_help=True,
)


@app.command("vllm")
def vllm(
    profile: str = PROFILE,
    gpu_memory: float = typer.Option(
        80.0, "--gpu-memory", help="GB of memory per GPU, for the tensor-parallel size."),
    port: int = typer.Option(8000, "--port", help="The port vLLM listens on."),
) -> None:
    """`vllm serve` with the profile's target and --speculative-config."""
    from specgen.commands.export import vllm as export

    typer.echo(export(load_profile(profile), gpu_memory, port).text(), nl=False)


@app.command("llama.cpp")
def llamacpp(
    profile: str = PROFILE,
    flavor: str = typer.Option(
        "current", "--flavor",
        help="current: builds with the --spec-* flags (late April 2026 on); legacy: older "
        "builds (--draft-max)."),
    port: int = typer.Option(8080, "--port", help="The port llama-server listens on."),
) -> None:
    """`llama-server` with the profile's target, draft and speculation flags."""
    from specgen.commands.export import llamacpp as export

    typer.echo(export(load_profile(profile), flavor, port).text(), nl=False)
