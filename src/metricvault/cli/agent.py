"""``metricvault agent`` inside the typer app: a pass-through to the agent's own argparse
command line (``metricvault.collect.cli``), which the entry point also calls directly so the
agent's process never imports typer and rich."""

from __future__ import annotations

import typer

AGENT_CONTEXT = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": [],
}


def agent(ctx: typer.Context) -> None:
    """Collect GPU (NVML, under dcgm-exporter's names), host and log metrics of this machine.

    Serves `/metrics` for Prometheus; `--push URL` also sends remote_write to a gateway.
    All options: `metricvault agent --help`.
    """
    from metricvault.collect.cli import main

    raise typer.Exit(main(ctx.args))
