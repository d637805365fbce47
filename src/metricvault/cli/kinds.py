"""``metricvault kind ...``: see and set whether a metric is a counter or a gauge.

A metric's kind decides how its series roll up (counters keep a reset-corrected ``increase``)
and whether ``rate``/``increase`` read the rollups. It comes from the name (``_total``,
dcgm-exporter's counter fields), from exposition metadata (which only ever upgrades a gauge to
a counter) or from an operator here; every change is recorded in the catalog.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from metricvault.cli.common import ConfigOpt, DataOpt, FormatOpt, SetOpt, emit, open_vault
from metricvault.errors import UnsupportedError

kind_app = typer.Typer(
    help="See and set metric kinds (counter or gauge), and the changes recorded.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@kind_app.callback()
def kind() -> None:
    """See and set metric kinds (counter or gauge), and the changes recorded."""


def _embedded(vault: Any) -> Any:
    if not hasattr(vault, "set_kind"):
        name = getattr(vault, "backend_name", type(vault).__name__)
        raise UnsupportedError(
            f"metric kinds are set on the embedded vault; this store is a {name}: run "
            "`metricvault kind` with --data pointing at the vault's directory or s3:// URI"
        )
    return vault


@kind_app.command("list")
def list_(
    changes: Annotated[
        bool, typer.Option("--changes", help="List the recorded kind changes instead.")
    ] = False,
    fmt: FormatOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Each stored metric's kind and where it came from (name, metadata, explicit, repair).

    With --changes: every recorded change (metric, from, to, when, source), oldest first.
    """
    import pyarrow as pa

    from metricvault.durations import ms_to_datetime

    with open_vault(data, config, set_) as opened:
        vault = _embedded(opened)
        recorded = vault.kind_changes()
        if changes:
            table = pa.table(
                {
                    "metric": [c.metric for c in recorded],
                    "from": [c.old for c in recorded],
                    "to": [c.new for c in recorded],
                    "at": [ms_to_datetime(c.at_ms).isoformat() for c in recorded],
                    "source": [c.source for c in recorded],
                }
            )
        else:
            table = _kinds_table(vault, {c.metric: c.source for c in recorded})
        emit(table, fmt, None)


def _kinds_table(vault: Any, sources: dict[str, str]) -> Any:
    import pyarrow as pa

    first: dict[str, Any] = {}
    for info in vault.index.all():
        first.setdefault(info.metric, info)
    stored_kinds = vault.catalog_version().metric_kinds
    rows = []
    for metric in sorted(first):
        kind = vault.index.kind(first[metric].series_id)
        source = sources.get(metric) or ("metadata" if metric in stored_kinds else "name")
        rows.append((metric, kind, source))
    return pa.table(
        {
            "metric": [r[0] for r in rows],
            "kind": [r[1] for r in rows],
            "source": [r[2] for r in rows],
        }
    )


@kind_app.command("set")
def set_kind(
    metric: Annotated[str, typer.Argument(help="The metric name, e.g. DCGM_FI_DEV_XID_ERRORS.")],
    kind: Annotated[str, typer.Argument(help="counter or gauge.")],
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Set a metric's kind: from now on its series roll up and read as KIND, and exposition
    metadata no longer changes it. Rollup rows written before keep their columns (see
    docs/operations.md). The change is committed and recorded before this returns.

    Example: `metricvault kind set DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter`
    """
    with open_vault(data, config, set_, need="write") as opened:
        vault = _embedded(opened)
        change = vault.set_kind(metric, kind)
        stored = any(info.metric == metric for info in vault.index.all())
    if change is None:
        print(f"{metric} is already set to {kind}: nothing changed")
        return
    note = "" if stored else " (no series of it is stored yet: check the name)"
    print(f"{metric}: {change.old} -> {change.new} from now on, recorded{note}")
