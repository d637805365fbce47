"""Remote-write 2.0 (``io.prometheus.write.v2.Request``): labels as references into the
request's symbol table, and per-series metadata."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from metricvault.errors import InputError, LabelError
from metricvault.ingest.protocols.remote_write_checks import (
    _Invalid,
    check_series,
    check_series_count,
    describe,
    parse,
    show,
    unexplained,
)
from metricvault.ingest.protocols.remote_write_columns import (
    DecodedWrite,
    Flat,
    Limits,
    assemble,
    decode_samples,
    result,
)
from metricvault.ingest.protocols.remote_write_metadata import metadata_v2
from metricvault.wire.proto import messages
from metricvault.wire.remote_write import CONTENT_TYPE_V1, PROTO_V2


def decode_v2(raw: memoryview, limits: Limits) -> DecodedWrite:
    request = parse(messages.RequestFast, raw, "2.0")
    merged = parse(messages.RequestMerged, raw, "2.0").timeseries
    limits.budget.check(f"parsing {len(raw):,} bytes of protobuf")
    symbols = list(request.symbols)
    all_series = request.timeseries
    if len(raw) and not symbols and not all_series:
        raise InputError(
            f"the body ({len(raw):,} bytes) holds no {PROTO_V2} fields (symbols, timeseries): "
            f"is it a remote-write 1.0 body? If so, send it with Content-Type {CONTENT_TYPE_V1!r}"
        )
    if symbols and symbols[0] != "":
        raise InputError(
            f"the symbol table starts with {show(symbols[0])}, but remote-write 2.0 requires "
            f"symbols[0] to be the empty string; fix the sender's symbol table"
        )
    check_series_count(len(all_series), limits.max_series)
    try:
        flat = _flatten_v2(all_series, merged, symbols)
        limits.check_flat(flat)
        shape = assemble(flat, limits.max_label_cells, limits.internal_label)
        metadata, kinds = metadata_v2(all_series, shape.metrics, symbols)
    except _Invalid:
        raise _explain_v2(raw, symbols, limits.internal_label) from None
    census = (len(merged.histograms), len(merged.exemplars))
    return result(shape, "2.0", metadata, kinds, *census)


def _flatten_v2(all_series: Any, merged: Any, symbols: list[str]) -> Flat:
    ref_counts = np.array([len(series.labels_refs) for series in all_series], dtype=np.int64)
    sample_counts = np.array([len(series.samples) for series in all_series], dtype=np.int64)
    refs = np.array(merged.labels_refs, dtype=np.int64)
    if (ref_counts % 2).any() or (len(refs) and refs.max() >= len(symbols)):
        raise _Invalid
    distinct_refs, codes = np.unique(refs[0::2], return_inverse=True)
    # A sender may repeat a string in the symbol table: one code per distinct name.
    code_of: dict[str, int] = {}
    recode = [code_of.setdefault(symbols[ref], len(code_of)) for ref in distinct_refs]
    as_values = pa.array([symbol or None for symbol in symbols], type=pa.string())
    sample_values, sample_timestamps = decode_samples(list(merged.samples))
    return Flat(
        label_counts=ref_counts // 2,
        codes=np.array(recode, dtype=np.int64)[codes] if len(codes) else codes,
        names=list(code_of),
        values=as_values.take(pa.array(refs[1::2])),
        sample_counts=sample_counts,
        sample_values=sample_values,
        sample_timestamps=sample_timestamps,
    )


def _explain_v2(raw: memoryview, symbols: list[str], internal_label: str = "") -> InputError:
    request = parse(messages.Request, raw, "2.0")  # raises if the protobuf is malformed
    for index, series in enumerate(request.timeseries):
        refs = list(series.labels_refs)
        if len(refs) % 2:
            raise LabelError(
                f"series #{index}: labels_refs has {len(refs)} entries, an odd number; it must "
                f"hold (name, value) symbol index pairs: fix the sender"
            )
        for ref in refs:
            if ref >= len(symbols):
                raise LabelError(
                    f"series #{index}: labels_refs points at symbol {ref}, but the symbol table "
                    f"has {len(symbols)} entries (0..{len(symbols) - 1}); fix the sender's "
                    f"symbol table"
                )
        names = [symbols[ref] for ref in refs[0::2]]
        values = [symbols[ref] for ref in refs[1::2]]
        check_series(names, values, partial(describe, index, names, values), internal_label)
        entry = series.metadata
        if entry.help_ref >= len(symbols) or entry.unit_ref >= len(symbols):
            raise LabelError(
                f"{describe(index, names, values)}: metadata help_ref={entry.help_ref}, "
                f"unit_ref={entry.unit_ref} point past the symbol table ({len(symbols)} "
                f"entries); fix the sender's symbol table"
            )
    return unexplained("2.0")
