"""Issue 12: the shared behaviour suite of the store boundary (metricvault.protocols).

Every backend that can read answers the same query the same way; every backend that cannot
do something says so with UnsupportedError (or ReadOnlyError) naming what it is and what to
do instead, before any work. The cases live in tests/backend_suite.py; the InfluxDB and
gateway parametrisations need real servers and live in tests/e2e/test_backends_contract.py;
the embedded vault on S3 is covered by the S3 tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import metricvault
from metricvault.archive.snapshot import export_snapshot
from metricvault.errors import MetricVaultError, ReadOnlyError, UnsupportedError
from metricvault.open import open_store
from metricvault.protocols import has
from metricvault.store.vault import Vault

from .. import backend_suite as suite

T0 = 1_699_999_200_000  # a whole hour (2023-11-14T22:00Z)
SAMPLES = suite.samples(T0)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The embedded vault and a raw snapshot exported from it, both opened by URI."""
    base = tmp_path_factory.mktemp("contract")
    with metricvault.open(str(base / "v"), need="write+experiments") as vault:
        suite.fill(vault, T0)
    embedded = open_store(str(base / "v"))
    assert isinstance(embedded, Vault)
    info = export_snapshot(embedded, suite.EXPERIMENT, base / "snap")
    snapshot = open_store(str(info.path))
    yield {"embedded": embedded, "snapshot": snapshot}
    embedded.close()
    snapshot.close()


@pytest.fixture(scope="module")
def rolled_up(tmp_path_factory):
    """A second vault with the same data, rolled up (maintained two hours after it)."""
    with metricvault.open(str(tmp_path_factory.mktemp("rolled") / "v"), need="read+write") as vault:
        suite.fill(vault, T0)
        vault.maintain(now_ms=T0 + 3 * suite.HOUR_MS)
        yield vault


@pytest.mark.parametrize("step", suite.STEPS)
@pytest.mark.parametrize("backend", ["snapshot"])
def test_every_reader_answers_a_query_alike(stores, backend, step):
    suite.check_query(stores["embedded"], stores[backend], T0, step)


@pytest.mark.parametrize("backend", ["embedded", "snapshot"])
def test_every_reader_lists_the_same_series(stores, backend):
    suite.check_series(stores["embedded"], stores[backend])


@pytest.mark.parametrize("backend", ["embedded", "snapshot"])
def test_every_reader_counts_the_same_series_in_its_stats(stores, backend):
    suite.check_stats(stores["embedded"], stores[backend], T0)


@pytest.mark.parametrize("backend", ["embedded", "snapshot"])
def test_every_reader_places_history_by_step_alike(stores, backend):
    suite.check_history(stores["embedded"], stores[backend])


@pytest.mark.parametrize("expr", suite.PROMQL)
@pytest.mark.parametrize("backend", ["snapshot"])
def test_promql_answers_alike_on_every_reader_over_raw_samples(stores, backend, expr):
    suite.check_promql(stores["embedded"], stores[backend], T0, expr)


@pytest.mark.parametrize("statement", suite.SQL)
@pytest.mark.parametrize("backend", ["snapshot"])
def test_sql_written_against_the_vault_runs_against_its_snapshot(stores, backend, statement):
    suite.check_sql(stores["embedded"], stores[backend], statement)


@pytest.mark.parametrize("expr", suite.PROMQL)
def test_promql_from_the_rollups_answers_as_the_raw_samples_do(stores, rolled_up, expr):
    """The maintained vault answers windows of whole minutes and hours from its 1m and 1h
    rows; the snapshot (raw samples only) is the reference."""
    tiers = suite.check_promql(stores["snapshot"], rolled_up, T0, expr)
    assert tiers == set()  # the snapshot reads raw samples
    served = suite.promql(rolled_up, expr, T0).served_by
    if expr in ROLLUP_ANSWERED:
        assert served & {"1m", "1h"}, f"{expr} was not answered from the rollups"


ROLLUP_ANSWERED = {
    f"increase({suite.COUNTER}[1h])",
    "count_over_time(gpu_util[1h])",
    "max_over_time(gpu_util[5m])",
    f"rate({suite.COUNTER}[5m])",
    "avg_over_time(train_loss[10m])",
}


def test_the_planner_reads_raw_samples_where_a_store_keeps_no_rollups(stores):
    """A snapshot, InfluxDB and a store in memory say they have no buckets; the engine reads
    their raw samples (no probing for methods)."""
    from metricvault.protocols import SelectHints
    from metricvault.selector import Matcher

    hints = SelectHints("rate", 3_600_000, 300_000, T0 + 3_600_000, T0 + 3_600_000)
    assert (
        stores["snapshot"].select_buckets([Matcher("__name__", "=", suite.COUNTER)], hints) is None
    )
    assert stores["snapshot"].horizons().raw_start_ms == 0


def test_capabilities_say_what_each_backend_does(stores):
    assert has(stores["embedded"], "serve") and has(stores["embedded"], "sql")
    assert has(stores["snapshot"], "read") and not has(stores["snapshot"], "write")
    gateway = open_store("http://127.0.0.1:9/")
    assert has(gateway, "write") and not has(gateway, "read")


@pytest.mark.parametrize(
    ("need", "what"),
    [
        ("serve", "serving a gateway"),
        ("write", "writing samples"),
        ("experiments", "the experiment registry"),
        ("maintain", "maintenance"),
    ],
)
def test_a_snapshot_refuses_what_it_cannot_do(stores, need, what):
    path = str(stores["snapshot"].path)
    with pytest.raises(UnsupportedError) as caught:
        metricvault.open(path, need=need)
    message = str(caught.value)
    assert f"{path} is an experiment snapshot, which cannot do {what}" in message
    assert "supports read, sql" in message and "vault directory" in message


def test_a_snapshot_says_it_has_no_registry_and_cannot_be_written(stores):
    with pytest.raises(UnsupportedError, match="cannot do the experiment registry"):
        stores["snapshot"].experiments.list()
    with pytest.raises(ReadOnlyError, match="frozen"):
        stores["snapshot"].write(SAMPLES)


def test_a_gateway_url_refuses_reading_before_any_request():
    with pytest.raises(
        UnsupportedError, match=r"http://127\.0\.0\.1:9 is a gateway, which cannot do reading"
    ):
        metricvault.open("http://127.0.0.1:9/")


def test_the_embedded_store_says_what_sql_lacks_on_no_backend(stores):
    """Every capability the embedded vault claims is one it answers (no UnsupportedError)."""
    vault = stores["embedded"]
    assert vault.sql("SELECT count(*) AS n FROM series", output="arrow")["n"].to_pylist() == [
        suite.SERIES
    ]
    assert vault.experiments.ids() == ["r1"]
    assert isinstance(vault.maintain(), dict)


def test_metricvault_open_is_the_function_after_importing_its_module():
    import metricvault.open as _module  # noqa: F401  (binds the submodule on first import)

    assert callable(metricvault.open) and metricvault.open.__name__ == "open"


@pytest.mark.parametrize("args", [["experiment", "list"], ["serve"]])
def test_cli_on_a_snapshot_is_a_clear_error_not_a_traceback(stores, args):
    path = str(stores["snapshot"].path)
    proc = subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args, "--data", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr
    assert "experiment snapshot, which cannot do" in " ".join(proc.stderr.split()), proc.stderr


def test_errors_of_the_boundary_are_metricvault_errors():
    assert issubclass(UnsupportedError, MetricVaultError)


def test_archive_export_through_a_gateway_url_is_refused_before_any_request(tmp_path):
    """It used to end in AttributeError ('GatewayVault' has no 'sample_reader'), after asking
    the gateway for the experiment."""
    gateway = open_store("http://127.0.0.1:9/")  # nothing listens: a request would fail
    with pytest.raises(UnsupportedError) as caught:
        export_snapshot(gateway, suite.EXPERIMENT, tmp_path)  # type: ignore[arg-type]
    message = " ".join(str(caught.value).split())
    assert "http://127.0.0.1:9 is a gateway, which cannot do archive export" in message
    assert "pass that directory or s3:// URI (or influxdb:// URI) as --data" in message
    assert not list(tmp_path.iterdir())


def test_archive_export_on_the_command_line_refuses_a_gateway_url_clearly(tmp_path):
    command = ["archive", "export", "r1", "--data", "http://127.0.0.1:9", "--output", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    message = " ".join(proc.stderr.split())
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "is a gateway, which cannot do archive export" in message, proc.stderr
    assert "as --data instead of the gateway URL" in message


@pytest.mark.parametrize("tier", ["1m", "1h"])
def test_a_rollup_snapshot_offers_the_vaults_rollup_view_with_its_rows(rolled_up, tmp_path, tier):
    info = export_snapshot(rolled_up, suite.EXPERIMENT, tmp_path, tier=tier)
    statement = (
        "SELECT series_id, ts, timestamp, count, sum, min, max, last, increase, mean "
        f"FROM rollup_{tier} ORDER BY series_id, ts"
    )
    with metricvault.open(str(info.path)) as snapshot:
        got = snapshot.sql(statement, output="arrow")
        assert got.to_pylist() == rolled_up.sql(statement, output="arrow").to_pylist()
        assert got.num_rows and snapshot.sql("SELECT count(*) AS n FROM raw", output="arrow")[
            "n"
        ].to_pylist() == [0]
