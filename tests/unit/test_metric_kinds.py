"""Counters stay counters: exposition metadata never downgrades a known kind, every change is
recorded, counted in the gateway's /metrics, and an operator can set a kind explicitly."""

from __future__ import annotations

import time

import cramjam
import pytest
from typer.testing import CliRunner

from metricvault.cli.main import app
from metricvault.config import Settings
from metricvault.model import metadata_kind_update
from metricvault.store.check import check
from metricvault.store.vault import Vault
from metricvault.wire.proto import messages

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
RW1 = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
# remote-write 1.0 MetricMetadata.MetricType
UNKNOWN, COUNTER, GAUGE = 0, 1, 2


@pytest.mark.parametrize(
    ("metric", "known", "explicit", "proposed", "applied", "refused"),
    [
        (ENERGY, None, False, "unknown", None, None),  # unknown says nothing
        (ENERGY, None, False, "", None, None),  # missing says nothing
        (ENERGY, None, False, "gauge", None, ("counter", "gauge")),  # the name's counter stands
        (ENERGY, None, False, "counter", None, None),  # agrees: nothing to record
        # a counter guessed from the name yields to the exporter's gauge (queue_total)
        ("http_requests_total", None, False, "gauge", ("counter", "gauge"), None),
        ("http_requests_total", "counter", False, "gauge", None, ("counter", "gauge")),
        ("foo_bytes", "counter", False, "gauge", None, ("counter", "gauge")),  # metadata's
        ("foo_bytes", None, False, "counter", ("gauge", "counter"), None),  # an upgrade
        ("foo_bytes", "gauge", False, "counter", ("gauge", "counter"), None),
        ("foo_bytes", "gauge", True, "counter", None, ("gauge", "counter")),  # operator's
        ("foo_bytes", "gauge", False, "gauge", None, None),
    ],
)
def test_metadata_only_upgrades_kinds_an_operator_did_not_set(
    metric, known, explicit, proposed, applied, refused
):
    update = metadata_kind_update(
        {metric: proposed},
        {metric: known} if known else {},
        {metric} if explicit else set(),
        1_000,
    )
    assert [(c.old, c.new) for c in update.applied] == ([applied] if applied else [])
    assert [(c.old, c.new) for c in update.refused] == ([refused] if refused else [])
    for change in (*update.applied, *update.refused):
        assert (change.metric, change.at_ms, change.source) == (metric, 1_000, "metadata")


def _now() -> int:
    return int(time.time() * 1000)


def _kinds(vault: Vault) -> dict[str, str]:
    frame = vault.series()
    return dict(zip(frame["metric"], frame["kind"], strict=True))


def test_contradicting_metadata_leaves_history_a_counter_and_upgrades_are_recorded(tmp_path):
    settings = Settings.load(env={})
    t = _now() - 60_000
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        # a write whose own metadata says gauge creates the energy series as counters anyway
        vault.write([(ENERGY, {"gpu": "0"}, t, 1.0)], kinds={ENERGY: "gauge"})
        vault.write([("foo_bytes", {"a": "b"}, t, 1.0)])
        update = vault.set_metric_kinds({ENERGY: "gauge", "foo_bytes": "counter", "x": "unknown"})
        assert [(c.metric, c.old, c.new) for c in update.refused] == [(ENERGY, "counter", "gauge")]
        assert [(c.metric, c.old, c.new) for c in update.applied] == [
            ("foo_bytes", "gauge", "counter")
        ]
        vault.write([(ENERGY, {"gpu": "1"}, t, 1.0)], kinds={ENERGY: "gauge"})
        assert _kinds(vault) == {ENERGY: "counter", "foo_bytes": "counter"}
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:  # committed, with the record
        assert _kinds(vault) == {ENERGY: "counter", "foo_bytes": "counter"}
        (change,) = vault.kind_changes()
        assert (change.metric, change.old, change.new, change.source) == (
            "foo_bytes",
            "gauge",
            "counter",
            "metadata",
        )
        assert t < change.at_ms <= _now()


def test_an_explicit_kind_is_recorded_and_metadata_never_changes_it(tmp_path):
    settings = Settings.load(env={})
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        vault.write([("foo_bytes", {"a": "b"}, _now() - 1000, 1.0)])
        change = vault.set_kind("foo_bytes", "counter")
        assert change is not None and (change.old, change.new, change.source) == (
            "gauge",
            "counter",
            "explicit",
        )
        assert vault.set_kind("foo_bytes", "counter") is None  # already so: nothing recorded
        assert vault.set_kind("foo_bytes", "gauge") is not None
        update = vault.set_metric_kinds({"foo_bytes": "counter"})
        assert update.refused and not update.applied
        vault.flush()
        assert _kinds(vault) == {"foo_bytes": "gauge"}
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        assert [(c.old, c.new) for c in vault.kind_changes()] == [
            ("gauge", "counter"),
            ("counter", "gauge"),
        ]
        assert not vault.set_metric_kinds({"foo_bytes": "counter"}).applied


def test_a_kind_set_by_another_process_reaches_an_open_vault(tmp_path):
    settings = Settings.load(env={})
    gateway = Vault.open_local(str(tmp_path / "v"), settings)
    try:
        gateway.write([("foo_bytes", {"a": "b"}, _now() - 1000, 1.0)])
        gateway.flush()
        with Vault.open_local(str(tmp_path / "v"), settings) as operator:
            operator.set_kind("foo_bytes", "counter")
        assert _kinds(gateway) == {"foo_bytes": "counter"}
        assert not gateway.set_metric_kinds({"foo_bytes": "gauge"}).applied
    finally:
        gateway.close()


@pytest.mark.parametrize(
    ("metric", "kind", "message"),
    [
        ("foo_bytes", "histogram", "is not one of gauge, counter"),
        ("foo-bytes", "counter", "invalid metric name"),
    ],
)
def test_bad_kind_set_is_refused_and_changes_nothing(tmp_path, metric, kind, message):
    from metricvault.errors import MetricVaultError

    with Vault.open_local(str(tmp_path / "v"), Settings.load(env={})) as vault:
        with pytest.raises(MetricVaultError, match=message):
            vault.set_kind(metric, kind)
        assert vault.kind_changes() == ()


def _metadata_request(*entries: tuple[int, str]) -> bytes:
    request = messages.WriteRequest()
    for kind, family in entries:
        request.metadata.add(type=kind, metric_family_name=family, help="h")
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _series_request(metric: str, value: float, ts: int) -> bytes:
    request = messages.WriteRequest()
    series = request.timeseries.add()
    series.labels.add(name="__name__", value=metric)
    series.labels.add(name="gpu", value="0")
    series.samples.add(value=value, timestamp=ts)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _counted(page: str, result: str, old: str, new: str) -> float:
    wanted = (f'from_kind="{old}"', f'to_kind="{new}"', f'result="{result}"')
    for line in page.splitlines():
        if line.startswith("metricvault_metric_kind_changes_total{") and all(
            w in line for w in wanted
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_gateway_keeps_counters_against_unknown_and_gauge_metadata_and_counts_it(make_client):
    client, vault = make_client()
    t = _now() - 60_000
    for metric in (ENERGY, "foo_bytes"):
        r = client.post("/api/v1/write", content=_series_request(metric, 5.0, t), headers=RW1)
        assert r.status_code == 204, r.text
    for entries in (
        [(UNKNOWN, ENERGY)],
        [(GAUGE, ENERGY)],
        [(COUNTER, "foo_bytes")],
        [(COUNTER, "no_series_yet")],  # a family name without series: nothing to record
    ):
        r = client.post("/api/v1/write", content=_metadata_request(*entries), headers=RW1)
        assert r.status_code == 204, r.text
    assert _kinds(vault) == {ENERGY: "counter", "foo_bytes": "counter"}
    page = client.get("/metrics").text
    assert _counted(page, "refused", "counter", "gauge") == 1  # unknown: not even asked
    assert _counted(page, "applied", "gauge", "counter") == 1
    vault.flush()
    assert [c.metric for c in vault.kind_changes()] == ["foo_bytes"]


def test_check_repair_sets_metadata_gauges_named_counters_back(tmp_path):
    """A vault the old agent→Prometheus flow damaged: metadata stored the energy counter as a
    gauge. check reports it and changes nothing; --repair sets it back and records it."""
    from metricvault.store.catalog import Change

    settings = Settings.load(env={})
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        vault.write([(ENERGY, {"gpu": "0"}, _now() - 1000, 1.0)])
        vault.flush()
        vault.catalog.commit(Change(metric_kinds={ENERGY: "gauge"}))  # what the old code did
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        assert _kinds(vault) == {ENERGY: "gauge"}
        location = vault.location
    report = check(location)
    assert not report.ok and ENERGY in report.problems[0].what
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        assert _kinds(vault) == {ENERGY: "gauge"}, "check without --repair changes nothing"
    repaired = check(location, repair=True)
    assert repaired.repaired_version is not None
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        assert _kinds(vault) == {ENERGY: "counter"}
        assert [(c.metric, c.new, c.source) for c in vault.kind_changes()] == [
            (ENERGY, "counter", "repair")
        ]
    assert check(location).ok


def test_kind_set_and_list_commands(tmp_path):
    data = str(tmp_path / "v")
    with Vault.open_local(data, Settings.load(env={})) as vault:
        vault.write([("foo_bytes", {"a": "b"}, _now() - 1000, 1.0)])
    runner = CliRunner()
    result = runner.invoke(app, ["kind", "set", "foo_bytes", "counter", "--data", data])
    assert result.exit_code == 0, result.output
    assert "foo_bytes: gauge -> counter from now on" in result.output
    result = runner.invoke(app, ["kind", "list", "--data", data, "-f", "csv"])
    assert result.exit_code == 0, result.output
    assert "foo_bytes,counter,explicit" in result.output
    result = runner.invoke(app, ["kind", "list", "--changes", "--data", data, "-f", "csv"])
    assert "foo_bytes,gauge,counter," in result.output and ",explicit" in result.output
    result = runner.invoke(app, ["kind", "set", "foo_bytes", "summary", "--data", data])
    assert result.exit_code != 0
