"""HA Prometheus pairs deduplicated at ingest (server/ha.py): one elected replica per tenant
and cluster, failover after ha_failover_timeout without its samples, the election shared by
every gateway of a vault through conditional writes, and the gateway's 202 and counter.

The election logic runs on an injected clock; the records are real files in a real vault
directory, written with the store's conditional write."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest

from metricvault.config import Settings
from metricvault.errors import ConfigError, LabelError, TooLargeError
from metricvault.server.ha import HATracker, local_location
from metricvault.store.layout import HA_DIR, open_location
from metricvault.wire.remote_write import encode_write_request
from tests.clocks import Clocks

RW1 = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
SETTINGS = Settings(ha_failover_timeout="30s", ha_update_timeout="15s", ha_cache_ttl="2s")


def tracker(tmp_path: Path, clock: Clocks, settings: Settings = SETTINGS) -> HATracker:
    """One gateway's tracker over the vault at ``tmp_path/vault`` (each call: another one)."""
    location = open_location(str(tmp_path / "vault"), settings)
    return HATracker(location, settings, clock=clock.monotonic)


def table(*rows: Mapping[str, str | None]) -> pa.Table:
    """A decoded request in the long shape, one sample per row (label columns by name)."""
    names = sorted({k for row in rows for k in row})
    columns: dict[str, pa.Array] = {
        "metric": pa.array(["up"] * len(rows)),
        "timestamp": pa.array(list(range(len(rows))), pa.int64()),
        "value": pa.array([1.0] * len(rows)),
    }
    for name in names:
        columns[name] = pa.array([row.get(name) for row in rows], pa.string())
    return pa.table(columns)


def pair(replica: str, cluster: str = "c1", samples: int = 3) -> pa.Table:
    return table(*[{"cluster": cluster, "__replica__": replica, "job": "node"}] * samples)


def generations(tmp_path: Path) -> int:
    return len(list((tmp_path / "vault" / HA_DIR).rglob("*.json")))


def test_the_first_replica_is_elected_and_the_other_is_dropped(tmp_path):
    clock = Clocks()
    ha = tracker(tmp_path, clock)
    first = ha.filter(pair("r1"), tenant="")
    assert first.dropped == {}
    assert first.table.num_rows == 3
    assert "__replica__" not in first.table.column_names  # the replica label goes
    assert first.table.column("cluster").to_pylist() == ["c1"] * 3  # the cluster label stays
    second = ha.filter(pair("r2"), tenant="")
    assert second.table.num_rows == 0
    assert second.dropped == {("c1", "r2"): 3}
    assert second.elected == {"c1": "r1"}
    assert "replica 'r2' of cluster 'c1'" in second.message()


def test_failover_after_the_timeout_without_samples_from_the_elected_replica(tmp_path):
    clock = Clocks()
    ha = tracker(tmp_path, clock)
    assert ha.elected("", "c1", "r1") == "r1"
    clock[0] += 29
    assert ha.elected("", "c1", "r2") == "r1"  # within the failover window: dropped
    clock[0] += 2  # 31 s since r1's last sample
    decision = ha.filter(pair("r2"), tenant="")
    assert decision.dropped == {} and decision.failovers == ["c1"]  # this request is stored
    assert ha.elected("", "c1", "r1") == "r2"  # the old leader is now the one dropped
    assert ha.failovers == 1


def test_a_replica_that_keeps_sending_stays_elected_and_its_time_is_written_sparingly(tmp_path):
    clock = Clocks()
    ha = tracker(tmp_path, clock)
    for _ in range(120):  # two minutes, a request of each replica every second
        assert ha.elected("", "c1", "r1") == "r1"
        assert ha.elected("", "c1", "r2") == "r1"
        clock[0] += 1
    # created once, then written every ha_update_timeout (15 s), not per request
    assert generations(tmp_path) == 1 + 119 // 15  # at 0 s, then 15 s, 30 s, ... 105 s


def test_every_gateway_of_a_vault_follows_one_election(tmp_path):
    clock = Clocks()
    a, b = tracker(tmp_path, clock), tracker(tmp_path, clock)
    assert a.elected("", "c1", "r1") == "r1"
    assert b.elected("", "c1", "r2") == "r1"  # b reads a's election from the vault
    assert b.elected("", "c1", "r1") == "r1"


def test_a_gateway_with_a_stale_view_does_not_drop_the_new_leaders_samples(tmp_path):
    """The failover happens at gateway a; b's cached copy still names r1. b must not drop r2's
    samples on that copy (r1 is dead: they would be lost from both replicas)."""
    clock = Clocks()
    settings = Settings(ha_failover_timeout="30s", ha_update_timeout="15s", ha_cache_ttl="1h")
    a, b = tracker(tmp_path, clock, settings), tracker(tmp_path, clock, settings)
    assert a.elected("", "c1", "r1") == "r1"
    assert b.elected("", "c1", "r1") == "r1"  # b caches r1 for an hour
    clock[0] += 31  # r1 died
    assert a.elected("", "c1", "r2") == "r2"  # a fails over
    decision = b.filter(pair("r2"), tenant="")
    assert decision.dropped == {} and decision.table.num_rows == 3
    assert b.failovers == 0  # b followed a's election, it did not make another
    assert b.elected("", "c1", "r1") == "r2"


def test_two_gateways_failing_over_at_once_elect_one_replica(tmp_path):
    clock = Clocks()
    a, b = tracker(tmp_path, clock), tracker(tmp_path, clock)
    assert a.elected("", "c1", "r1") == "r1"
    assert b.elected("", "c1", "r1") == "r1"
    clock[0] += 31
    assert a.elected("", "c1", "r2") == "r2"
    assert b.elected("", "c1", "r3") == "r2"  # b's conditional write loses; it follows r2
    assert a.failovers + b.failovers == 1


@pytest.mark.parametrize(
    ("row", "stored_labels"),
    [
        ({"job": "node"}, {"job": "node"}),  # no HA labels: stored as sent
        ({"cluster": "c1", "job": "node"}, {"cluster": "c1", "job": "node"}),
    ],
)
def test_rows_without_both_labels_are_stored_as_sent(tmp_path, row, stored_labels):
    ha = tracker(tmp_path, Clocks())
    ha.elected("", "c1", "r1")
    decision = ha.filter(table(row, {"cluster": "c1", "__replica__": "r2"}), tenant="")
    assert decision.dropped == {("c1", "r2"): 1}
    assert decision.table.num_rows == 1
    got = {
        name: decision.table.column(name)[0].as_py()
        for name in decision.table.column_names
        if name not in ("metric", "timestamp", "value")
    }
    assert {k: v for k, v in got.items() if v is not None} == stored_labels


def test_a_replica_label_without_a_cluster_label(tmp_path):
    """Not deduplicated (Mimir stores it as sent): kept when it is an ordinary label name;
    refused, whole request, when it is reserved (``__replica__`` cannot be stored)."""
    row = {"prom_replica": "a", "job": "node"}
    ordinary = tracker(tmp_path, Clocks(), Settings(ha_replica_label="prom_replica"))
    kept = ordinary.filter(table(row, {"cluster": "c1", "prom_replica": "b"}), tenant="")
    assert kept.table.column("prom_replica").to_pylist() == ["a", None]
    reserved = tracker(tmp_path, Clocks())
    with pytest.raises(LabelError, match="but no 'cluster' label"):
        reserved.filter(table({"__replica__": "r2"}, {"cluster": "c1", "__replica__": "r1"}), "")
    with pytest.raises(LabelError, match="external_labels"):
        reserved.filter(table({"__replica__": "r2"}), "")
    assert generations(tmp_path) == 1  # the ordinary tracker's election only


def test_one_request_with_several_clusters_is_decided_per_cluster(tmp_path):
    ha = tracker(tmp_path, Clocks())
    ha.elected("", "c1", "r1")
    ha.elected("", "c2", "r2")
    decision = ha.filter(
        table(
            {"cluster": "c1", "__replica__": "r1"},
            {"cluster": "c1", "__replica__": "r2"},
            {"cluster": "c2", "__replica__": "r1"},
            {"cluster": "c2", "__replica__": "r2"},
        ),
        tenant="",
    )
    assert decision.dropped == {("c1", "r2"): 1, ("c2", "r1"): 1}
    assert decision.table.column("cluster").to_pylist() == ["c1", "c2"]


def test_tenants_have_elections_of_their_own(tmp_path):
    ha = tracker(tmp_path, Clocks())
    assert ha.elected("team-a", "c1", "r1") == "r1"
    assert ha.elected("team-b", "c1", "r2") == "r2"


def test_label_values_never_name_a_path(tmp_path):
    ha = tracker(tmp_path, Clocks())
    assert ha.elected("../x", "../../etc", "r/1") == "r/1"
    written = list((tmp_path / "vault" / HA_DIR).rglob("*.json"))
    assert len(written) == 1 and (tmp_path / "vault" / HA_DIR) in written[0].parents
    assert not (tmp_path / "etc").exists()


def test_a_new_cluster_over_the_limit_is_refused_and_changes_nothing(tmp_path):
    settings = Settings(ha_max_clusters=2)
    ha = tracker(tmp_path, Clocks(), settings)
    ha.elected("", "c1", "r1")
    ha.elected("", "c2", "r1")
    before = generations(tmp_path)
    with pytest.raises(TooLargeError, match="ha_max_clusters"):
        ha.filter(pair("r1", cluster="c3"), tenant="")
    assert generations(tmp_path) == before
    assert ha.elected("", "c1", "r2") == "r1"  # known clusters go on


def test_an_empty_replica_label_turns_deduplication_off(tmp_path):
    ha = tracker(tmp_path, Clocks(), Settings(ha_replica_label=""))
    decision = ha.filter(pair("r2"), tenant="")
    assert decision.table.num_rows == 3 and "__replica__" in decision.table.column_names
    assert generations(tmp_path) == 0


def test_configurable_labels(tmp_path):
    settings = Settings(ha_cluster_label="prom_cluster", ha_replica_label="prom_replica")
    ha = tracker(tmp_path, Clocks(), settings)
    first = ha.filter(table({"prom_cluster": "k", "prom_replica": "a"}), tenant="")
    second = ha.filter(table({"prom_cluster": "k", "prom_replica": "b"}), tenant="")
    assert first.table.column_names[-1] == "prom_cluster" and second.dropped == {("k", "b"): 1}


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"ha_update_timeout": "30s", "ha_failover_timeout": "30s"}, "must be shorter than"),
        ({"ha_cluster_label": "x", "ha_replica_label": "x"}, "two different labels"),
        ({"ha_failover_timeout": "soon"}, "ha_failover_timeout"),
        ({"ha_max_clusters": 0}, "ha_max_clusters"),
    ],
)
def test_bad_ha_settings_are_refused(overrides, words):
    with pytest.raises(ConfigError, match=words):
        Settings(**overrides)


def test_a_store_without_vault_files_keeps_elections_in_its_state_directory(tmp_path):
    location = local_location(tmp_path / "state")
    clock = Clocks()
    a = HATracker(location, SETTINGS, clock=clock.monotonic)
    b = HATracker(location, SETTINGS, clock=clock.monotonic)
    assert a.elected("", "c1", "r1") == "r1" and b.elected("", "c1", "r2") == "r1"


def _body(replica: str, ts: int, cluster: str = "c1") -> bytes:
    labels = {"__replica__": replica, "job": "node", "instance": "h:9100"}
    if cluster:
        labels["cluster"] = cluster
    return encode_write_request([("up", labels, ts, 1.0)])


@pytest.fixture
def reserved_names_encodable(monkeypatch):
    """The test encoder refuses reserved label names as the gateway does; Prometheus sends
    ``__replica__`` as an external label, so let the encoder write it."""
    monkeypatch.setattr("metricvault.wire.remote_write.label_name_problem", lambda name: None)


def test_the_gateway_answers_202_for_the_non_elected_replica_and_counts_its_samples(
    make_client, reserved_names_encodable
):
    client, vault = make_client()
    ts = 1_767_225_600_000
    assert client.post("/api/v1/write", content=_body("r1", ts), headers=RW1).status_code == 204
    r = client.post("/api/v1/write", content=_body("r2", ts + 1), headers=RW1)
    assert r.status_code == 202, r.text
    assert "replica 'r2' of cluster 'c1'" in r.text
    page = client.get("/metrics").text
    assert 'metricvault_ha_dropped_samples_total{cluster="c1",replica="r2"} 1.0' in page
    vault.flush()
    got = vault.query("up", ts - 1, ts + 10)
    assert len(got) == 1 and "__replica__" not in got.columns
    assert got["cluster"].tolist() == ["c1"]


def test_the_gateway_refuses_a_reserved_replica_label_without_a_cluster_label(
    make_client, reserved_names_encodable
):
    client, vault = make_client()
    r = client.post("/api/v1/write", content=_body("r1", 1_767_225_600_000, ""), headers=RW1)
    assert r.status_code == 400 and "no 'cluster' label" in r.text
    vault.flush()
    assert vault.stats()["tiers"]["raw"]["rows"] == 0


def test_without_deduplication_the_replica_label_is_refused_as_reserved(
    make_client, reserved_names_encodable
):
    client, _ = make_client(ha_replica_label="")
    r = client.post("/api/v1/write", content=_body("r1", 1_767_225_600_000), headers=RW1)
    assert r.status_code == 400 and "reserved" in r.text


@pytest.mark.parametrize(("internal_label", "accepted"), [("__replica__", True), ("", False)])
def test_the_decoder_lets_only_the_replica_label_through_of_the_reserved_names(
    reserved_names_encodable, internal_label, accepted
):
    from metricvault.errors import LabelError as Refused
    from metricvault.ingest.protocols.remote_write import DecodedWrite, decode_remote_write

    def decode(body: bytes) -> object:
        return decode_remote_write(
            body,
            content_type=RW1["Content-Type"],
            content_encoding="snappy",
            version_header="0.1.0",
            internal_label=internal_label,
        )

    body = _body("r1", 1_767_225_600_000)
    if accepted:
        decoded = decode(body)
        assert isinstance(decoded, DecodedWrite)
        assert decoded.table.column("__replica__").to_pylist() == ["r1"]
    else:
        with pytest.raises(Refused, match="reserved"):
            decode(body)
    other = encode_write_request([("up", {"__other__": "x"}, 1_767_225_600_000, 1.0)])
    with pytest.raises(Refused, match="reserved"):  # any other reserved name stays refused
        decode(other)


def test_the_documented_ha_pair_config_is_valid_and_carries_the_default_labels(tmp_path):
    """docs/gateway.md shows each replica's external labels; promtool must accept them, and
    they must be the labels the gateway deduplicates by."""
    import shutil
    import subprocess

    import yaml

    docs = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"
    section = docs.read_text().split("## HA Prometheus pairs", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    labels = yaml.safe_load(block)["global"]["external_labels"]
    defaults = Settings()
    assert set(labels) == {defaults.ha_cluster_label, defaults.ha_replica_label}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: apt-get install prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(block)
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
