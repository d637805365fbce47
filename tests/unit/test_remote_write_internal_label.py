"""The gateway's internal label (the HA replica label) and the series cache: a request whose
series do not carry it is decoded through the cache (prepared samples), one that carries it
takes the full path and keeps the label for the HA filter, reserved name or not."""

from __future__ import annotations

import pytest

from metricvault.ingest.protocols.remote_write import DecodedWrite, decode_remote_write
from metricvault.wire.remote_write import encode_write_request

T0 = 1_767_225_600_000
TAG = {"__replica__": "reserved", "replica": "plain"}  # job values that hold no label name


@pytest.fixture
def reserved_names_encodable(monkeypatch):
    """The test encoder refuses reserved names as the gateway does; Prometheus sends
    ``__replica__`` as an external label, so let the encoder write it."""
    monkeypatch.setattr("metricvault.wire.remote_write.label_name_problem", lambda name: None)


def decode(body: bytes, internal_label: str) -> DecodedWrite:
    return decode_remote_write(
        body,
        content_type="application/x-protobuf",
        content_encoding="snappy",
        version_header="0.1.0",
        internal_label=internal_label,
    )


def plain(job: str, ts: int) -> tuple[str, dict[str, str], int, float]:
    return ("internal_label_test_up", {"job": job, "instance": "h:9100"}, ts, 1.0)


@pytest.mark.parametrize("internal_label", ["__replica__", "replica"])
def test_series_without_the_internal_label_are_decoded_through_the_series_cache(
    internal_label,
):
    body = encode_write_request([plain(f"cached-{TAG[internal_label]}", T0)])
    first = decode(body, internal_label)  # learned
    again = decode(body, internal_label)
    assert first.prepared() is not None and again.prepared() is not None
    assert again.table.column("job").to_pylist() == [f"cached-{TAG[internal_label]}"]


@pytest.mark.parametrize("internal_label", ["__replica__", "replica"])
def test_a_request_with_the_internal_label_keeps_it_beside_series_the_cache_knows(
    reserved_names_encodable, internal_label
):
    known = plain(f"known-{TAG[internal_label]}", T0)
    decode(encode_write_request([known]), internal_label)  # the cache knows this series now
    replicated = ("internal_label_test_up", {"job": "ha", internal_label: "r1"}, T0, 2.0)
    decoded = decode(encode_write_request([known, replicated]), internal_label)
    assert decoded.prepared() is None  # the full path: the HA filter sees the table
    rows = sorted(
        zip(
            decoded.table.column("job").to_pylist(),
            decoded.table.column(internal_label).to_pylist(),
            strict=True,
        ),
        key=str,
    )
    assert rows == sorted([(f"known-{TAG[internal_label]}", None), ("ha", "r1")], key=str)


def test_without_an_internal_label_a_reserved_name_is_refused_after_the_cache_path(
    reserved_names_encodable,
):
    from metricvault.errors import LabelError

    body = encode_write_request([("internal_label_test_up", {"__replica__": "r1"}, T0, 1.0)])
    with pytest.raises(LabelError, match="reserved"):
        decode(body, "")
