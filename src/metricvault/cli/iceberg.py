"""``metricvault iceberg ...``: the vault's tiers as Apache Iceberg tables for other engines."""

from __future__ import annotations

from typing import Annotated

import typer

from metricvault.cli.common import ConfigOpt, DataOpt, FormatOpt, SetOpt, emit, load_settings
from metricvault.errors import InputError

iceberg_app = typer.Typer(
    help="Publish the tiers as Apache Iceberg tables (Spark, Trino, Dask, DuckDB read them).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@iceberg_app.callback()
def iceberg() -> None:
    """Publish the tiers as Apache Iceberg tables (Spark, Trino, Dask, DuckDB read them)."""


@iceberg_app.command()
def publish(
    tier: Annotated[
        list[str] | None,
        typer.Option("--tier", "-t", help="Only this tier (raw, 1m, 1h); repeat for more."),
    ] = None,
    fmt: FormatOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Mirror the vault's committed files into Iceberg tables `raw`, `rollup_1m`, `rollup_1h`.

    The tables live in the SQL catalog `iceberg_catalog` (a SQLAlchemy URI: SQLite for one
    machine, PostgreSQL for many), their files under `iceberg_warehouse`, in the namespace
    `iceberg_namespace` (`metricvault`). Columns are decoded (timestamps, doubles, a labels
    map and one column per common DCGM label) and partitioned by day: docs/iceberg.md.

    Each vault file is appended once: every Iceberg snapshot records which vault files the
    table holds, so a publish killed at any moment is finished by the next one, never
    doubled. Files that compaction, a late-data rollup or retention replaced are deleted from
    the table in the same commit that adds their replacements. `metricvault maintain` runs
    this after each round when `iceberg_catalog` is set.

    Buffered samples are flushed first. Prints one row per table: vault files added and
    removed, rows added, vault files held, the Iceberg snapshot id.

    Example: `metricvault iceberg publish --set iceberg_catalog=sqlite:////srv/mv/iceberg.db`
    """
    import pyarrow as pa

    from metricvault.cli.light import open_with
    from metricvault.model import TIERS
    from metricvault.store.iceberg import publish as publish_tables

    settings = load_settings(data, config, set_)
    tiers = tier or list(TIERS)
    bad = [t for t in tiers if t not in TIERS]
    if bad:
        raise InputError(f"--tier {bad[0]!r} is not a tier: give raw, 1m or 1h")
    if not settings.iceberg_catalog:
        raise InputError(
            "iceberg_catalog is not set: pass --set iceberg_catalog=sqlite:////path/iceberg.db "
            "(or postgresql+psycopg://user:pw@host/db), or set it in the config file"
        )
    with open_with(settings, need="maintain") as vault:
        vault.flush_for_read()
        results = publish_tables(vault, settings, tiers)
    table = pa.table(
        {
            "table": [f"{settings.iceberg_namespace}.{r.table}" for r in results],
            "added_files": [r.added_files for r in results],
            "removed_files": [r.removed_files for r in results],
            "rows_added": [r.rows_added for r in results],
            "files": [r.files for r in results],
            "snapshot_id": [str(r.snapshot_id or "") for r in results],
        }
    )
    emit(table, fmt, None, title="iceberg publish")
