"""One owner for the name rules (issue 12): every way into the store refuses the same names.

``metricvault.model`` decides which metric and label names are valid and which label names are
reserved (a column of the tables the store hands back, which the label would hide). Remote
write 1.0 and 2.0, line protocol, ``Vault.write`` (tuples and tables) and the agent's
remote-write encoder must all apply that one rule, with the one message naming the label and
why. Before issue 12 each spelled out its own list, and ``kind`` / ``series_id`` got through:
``vault.series()`` then showed the label's value instead of the real kind and id.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cramjam
import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.collect import training
from metricvault.collect.sources.host import validate_extra_labels
from metricvault.config import Settings
from metricvault.errors import LabelError
from metricvault.ingest.protocols.influx_line import decode_line_protocol
from metricvault.ingest.protocols.remote_write import decode_remote_write
from metricvault.model import RESERVED_AGGREGATES, RESERVED_LABEL_NAMES, label_name_problem
from metricvault.server.app import create_app
from metricvault.store.normalize import normalize
from metricvault.wire.proto import messages
from metricvault.wire.remote_write import encode_write_request

T0 = 1_767_225_600_000  # 2026-01-01, inside the store's accepted years
CT_V1 = "application/x-protobuf"
CT_V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
# Every column that sits beside the label columns in a table the store returns or takes.
EXPECTED_RESERVED = {
    "metric",
    "timestamp",
    "ts",
    "value",
    "series_id",
    "kind",
    *RESERVED_AGGREGATES,
}
# Names whose validity every path must judge alike: reserved, valid, invalid, Prometheus'.
CANDIDATES = sorted(
    EXPECTED_RESERVED
    | {"gpu", "job", "le", "_x", "a1", "Kind", "KIND", "exported_kind", "series", "labels"}
    | {"p99", "stddev"}  # aggregates added later, not reserved: senders keep writing them
    | {"_", "__x", "__meta_pod", "1x", "a-b", "a.b", "\u00e9t\u00e9", "a b", ""}
)


def v1_body(labels: dict[str, str]) -> bytes:
    request = messages.WriteRequest()
    series = request.timeseries.add()
    for name, value in sorted({"__name__": "up", **labels}.items()):
        series.labels.add(name=name, value=value)
    series.samples.add(value=1.0, timestamp=T0)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def v2_body(labels: dict[str, str]) -> bytes:
    request = messages.Request()
    request.symbols.append("")
    series = request.timeseries.add()
    for name, value in sorted({"__name__": "up", **labels}.items()):
        for text in (name, value):
            request.symbols.append(text)
            series.labels_refs.append(len(request.symbols) - 1)
    series.samples.add(value=1.0, timestamp=T0)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def remote_write(body: bytes, content_type: str) -> None:
    decode_remote_write(
        body, content_type=content_type, content_encoding="snappy", version_header=None
    )


def via_v1(name: str) -> None:
    remote_write(v1_body({name: "x"}), CT_V1)


def via_v2(name: str) -> None:
    remote_write(v2_body({name: "x"}), CT_V2)


def via_line_protocol(name: str) -> None:
    decode_line_protocol(f"up,{name}=x f=1 {T0}".encode(), precision="ms")


def via_tuples(name: str) -> None:
    normalize([("up", {name: "x"}, T0, 1.0)])


def via_table(name: str) -> None:
    normalize(pa.table({"metric": ["up"], "timestamp": [T0], "value": [1.0], name: ["x"]}))


def via_encoder(name: str) -> None:
    encode_write_request([("up", {name: "x"}, T0, 1.0)])


def via_agent_labels(name: str) -> None:
    # ``metricvault agent --label NAME=VALUE``: refused at start, not by the gateway forever.
    validate_extra_labels({name: "x"}, reserved=())


def via_track_labels(name: str) -> None:
    # ``metricvault.track(..., labels=...)`` checks them before it opens a store (the helper it
    # calls is used here so that accepted names open nothing).
    training._labels("r1", "host-1", {name: "x"})


PATHS: dict[str, Callable[[str], None]] = {
    "remote_write 1.0": via_v1,
    "remote_write 2.0": via_v2,
    "line protocol": via_line_protocol,
    "Vault.write tuples": via_tuples,
    "Vault.write table": via_table,
    "agent encoder": via_encoder,
    "agent extra labels": via_agent_labels,
    "track labels": via_track_labels,
}


def applies(path: str, name: str) -> bool:
    """Whether ``name`` can reach ``path``'s name check as a label name at all."""
    if path == "line protocol":
        # Tag keys are mapped onto the label alphabet first ('a-b' becomes 'a_b'; an empty or
        # spaced key is a syntax error): only names the mapping leaves alone test the rule.
        return (
            bool(name)
            and name[0] not in "0123456789"
            and name.isascii()
            and (name.replace("_", "").isalnum() or set(name) == {"_"})
        )
    if path == "Vault.write table":
        # metric, timestamp and value are the table's data columns there, not labels.
        return name not in ("metric", "timestamp", "value")
    return True


def refusal(path: str, name: str) -> str | None:
    """The error message ``path`` gives for a label ``name`` (None: accepted)."""
    try:
        PATHS[path](name)
    except (LabelError, ValueError) as exc:
        return str(exc)
    return None


def test_model_reserves_every_column_beside_the_labels() -> None:
    assert RESERVED_LABEL_NAMES == EXPECTED_RESERVED


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_refuses_exactly_the_names_the_model_refuses(path: str) -> None:
    accepted = []
    refused = []
    for name in CANDIDATES:
        if not applies(path, name):
            continue
        message = refusal(path, name)
        problem = label_name_problem(name)
        if problem is None:
            assert message is None, f"{path} refused the valid label name {name!r}: {message}"
            accepted.append(name)
        else:
            assert message is not None, f"{path} accepted the label name {name!r}: {problem}"
            assert problem in message, f"{path} words the refusal of {name!r} its own way"
            refused.append(name)
    assert accepted and refused  # the table holds both kinds for every path


@pytest.mark.parametrize("name", ["series_id", "kind", "timestamp", "value", "metric", "ts"])
def test_reserved_labels_are_refused_with_one_message(name: str) -> None:
    problem = label_name_problem(name)
    assert problem is not None
    assert repr(name).strip("'") in problem and "reserved" in problem and "rename" in problem
    for path in PATHS:
        if applies(path, name):
            message = refusal(path, name)
            assert message is not None and problem in message, (path, message)


@pytest.fixture
def gateway(tmp_path: Path) -> Any:
    settings = Settings.load(env={}, gateway_maintain=False)
    vault = Vault.open_local(str(tmp_path / "vault"), settings)
    with TestClient(create_app(vault, settings)) as client:
        yield client, vault
    vault.close()


@pytest.mark.parametrize("name", ["series_id", "kind"])
def test_series_id_and_kind_labels_are_refused_with_400_everywhere(gateway: Any, name: str) -> None:
    client, vault = gateway
    problem = label_name_problem(name)
    assert problem is not None
    requests = [
        ("/api/v1/write", v1_body({name: "abc"}), {"Content-Type": CT_V1}),
        ("/api/v1/write", v2_body({name: "abc"}), {"Content-Type": CT_V2}),
        ("/write?precision=ms", f"up,{name}=abc f=1 {T0}".encode(), {}),
        ("/api/v2/write?precision=ms", f"up,{name}=abc f=1 {T0}".encode(), {}),
    ]
    for path, body, headers in requests:
        headers = {"Content-Encoding": "snappy", **headers} if "v1/write" in path else headers
        answer = client.post(path, content=body, headers=headers)
        assert answer.status_code == 400, (path, answer.text)
        assert problem in answer.text, (path, answer.text)
    with pytest.raises(LabelError) as refused:
        vault.write([("up", {name: "abc"}, T0, 1.0)])
    assert refused.value.status == 400 and problem in str(refused.value)
    vault.write([("up", {"job": "abc"}, T0, 1.0)])
    series = vault.series()
    assert list(series["kind"]) == ["gauge"] and list(series["job"]) == ["abc"]
    assert series["series_id"].dtype.kind == "i"


def test_the_documented_relabel_rule_is_a_valid_prometheus_config(tmp_path: Path) -> None:
    # docs/gateway.md shows senders how to rename a reserved label; promtool must accept it.
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: apt-get install prometheus")
    docs = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"
    block = docs.read_text().split("```yaml\nwrite_relabel_configs:\n", 1)[1].split("```", 1)[0]
    rules = "".join(f"    {line}\n" for line in block.splitlines())
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "remote_write:\n  - url: http://127.0.0.1:9/api/v1/write\n"
        f"    write_relabel_configs:\n{rules}"
    )
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "labelmap" in rules and "exported_kind" in rules
