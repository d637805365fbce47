"""Remote-write 1.0 (``prometheus.WriteRequest``): labels as (name, value) messages."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from metricvault.errors import InputError
from metricvault.ingest.protocols.remote_write_checks import (
    _Invalid,
    check_series,
    check_series_count,
    describe,
    parse,
    unexplained,
)
from metricvault.ingest.protocols.remote_write_columns import (
    DecodedWrite,
    Flat,
    Limits,
    assemble,
    decode_samples,
    label_pairs,
    result,
)
from metricvault.ingest.protocols.remote_write_known import decode_v1_known
from metricvault.ingest.protocols.remote_write_metadata import kinds_v1, metadata_v1
from metricvault.wire.proto import messages
from metricvault.wire.remote_write import CONTENT_TYPE_V2, PROTO_V1


def decode_v1(raw: memoryview, limits: Limits) -> DecodedWrite:
    known = decode_v1_known(raw, limits) if limits.known_series else None
    if known is not None:  # most requests: every series was seen before
        return known
    request = parse(messages.WriteRequestFast, raw, "1.0")
    merged = parse(messages.WriteRequestMerged, raw, "1.0").timeseries
    limits.budget.check(f"parsing {len(raw):,} bytes of protobuf")
    all_series = request.timeseries
    if len(raw) and not all_series and not request.metadata:
        raise InputError(
            f"the body ({len(raw):,} bytes) holds no {PROTO_V1} fields (timeseries, metadata): "
            f"is it a remote-write 2.0 body? If so, send it with Content-Type {CONTENT_TYPE_V2!r}"
        )
    check_series_count(len(all_series), limits.max_series)
    try:
        flat = _flatten_v1(all_series, merged, limits)
        limits.check_flat(flat)
        shape = assemble(flat, limits.max_label_cells, limits.internal_label)
    except _Invalid:
        raise _explain_v1(raw, limits.internal_label) from None
    metadata = tuple(metadata_v1(request.metadata))
    census = (len(merged.histograms), len(merged.exemplars))
    return result(shape, "1.0", metadata, kinds_v1(metadata), *census)


def _flatten_v1(all_series: Any, merged: Any, limits: Limits) -> Flat:
    label_counts = np.array([len(series.labels) for series in all_series], dtype=np.int64)
    sample_counts = np.array([len(series.samples) for series in all_series], dtype=np.int64)
    pair_of_label, pair_names, pair_values = label_pairs(
        merged.labels, limits.budget, limits.label_cache
    )
    code_of: dict[str, int] = {}
    code_of_pair = [code_of.setdefault(name, len(code_of)) for name in pair_names]
    sample_values, sample_timestamps = decode_samples(list(merged.samples))
    return Flat(
        label_counts=label_counts,
        codes=np.array(code_of_pair, dtype=np.int64)[pair_of_label],
        names=list(code_of),
        values=pa.array(pair_values, type=pa.string()).take(pa.array(pair_of_label)),
        sample_counts=sample_counts,
        sample_values=sample_values,
        sample_timestamps=sample_timestamps,
    )


def _explain_v1(raw: memoryview, internal_label: str = "") -> InputError:
    request = parse(messages.WriteRequest, raw, "1.0")  # raises if the protobuf is malformed
    for index, series in enumerate(request.timeseries):
        names = [label.name for label in series.labels]
        values = [label.value for label in series.labels]
        check_series(names, values, partial(describe, index, names, values), internal_label)
    return unexplained("1.0")
