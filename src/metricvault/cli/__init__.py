"""The ``metricvault`` command line: a thin layer over the Python API.

``main`` sends ``metricvault agent ...`` straight to the agent's light argparse command line
(no typer, rich or pandas in a process that runs on every GPU host), and the hot commands
(``query``, ``series``, ``stats``, ``--version``) to :mod:`metricvault.cli.light`, which runs
them without the ~0.2 s that typer's and rich's imports cost; everything else (``--help``
included) goes to the typer app in :mod:`metricvault.cli.main`.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main"]


def main() -> None:
    if sys.argv[1:2] == ["agent"]:
        from metricvault.collect.cli import main as agent_main

        sys.exit(agent_main(sys.argv[2:]))
    from metricvault.cli.light import dispatch

    status = dispatch(sys.argv[1:])
    if status is not None:
        sys.exit(status)
    from metricvault.cli.main import main as cli_main

    cli_main()


def __getattr__(name: str) -> Any:
    if name == "app":
        from metricvault.cli.main import app

        return app
    raise AttributeError(f"module 'metricvault.cli' has no attribute {name!r}")
