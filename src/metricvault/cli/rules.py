"""``metricvault rules ...``: check Prometheus rule files and run their unit tests, as
``promtool check rules`` and ``promtool test rules`` do (same reports, same exit status)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

rules_app = typer.Typer(
    help="Prometheus alerting and recording rules: check rule files, run their unit tests.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

FilesArg = Annotated[list[str], typer.Argument(help="Files (rule files or unit-test files).")]


@rules_app.callback()
def rules() -> None:
    """Prometheus rule files, as `metricvault serve --rules` evaluates them."""


@rules_app.command()
def check(
    files: FilesArg,
    lint_fatal: Annotated[
        bool,
        typer.Option("--lint-fatal", help="Exit 3 on lint problems (duplicate recording rules)."),
    ] = False,
) -> None:
    """Check rule files as `promtool check rules` does: every problem of each file in
    Prometheus's words; exit 1 if any file is invalid."""
    from metricvault.rules.files import check_rule_files_report

    raise typer.Exit(check_rule_files_report(files, sys.stdout, sys.stderr, lint_fatal))


@rules_app.command("test")
def test_(files: FilesArg) -> None:
    """Run `promtool test rules` unit-test files (input series, `alert_rule_test`,
    `promql_expr_test`) against metricvault's evaluator; exit 1 on any failure, reported as
    promtool reports it."""
    from metricvault.rules.unittest import run_rule_tests

    raise typer.Exit(run_rule_tests(files, sys.stdout, sys.stderr))
