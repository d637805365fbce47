"""Prometheus remote-write 1.0 and 2.0 request bodies -> the long-shape Arrow table.

A pure function: bytes and three header values in, a ``DecodedWrite`` out, or a
``MetricVaultError`` subclass raised and nothing returned: a request is taken whole or not at
all. No I/O, no store.

What is kept and what is only counted:

- Every float sample becomes one table row, in request order, its value bit-exact: staleness
  markers (NaN with bits ``0x7ff0000000000002``) too, counted in ``stale_markers``, and every
  other NaN/±Inf, counted in ``non_finite`` (PromQL needs them). Both counts are part
  of ``samples`` = float samples received = rows of the table.
- Native histogram samples and exemplars are counted (``histograms``, ``exemplars``), not stored;
  the gateway reports them as received but not written.
- 1.0 metadata entries are returned as sent (Prometheus sends them in their own requests); 2.0
  per-series metadata is de-duplicated. 2.0 ``created_timestamp`` is read past; exemplar label
  references are not checked.
- A label with an empty value is the same as no label (Prometheus semantics): it is null, and a
  label name that only ever has empty values gets no column.

Version negotiation follows the specs and Prometheus's own receiver: the ``proto`` parameter of
``Content-Type`` decides; without one (or without a Content-Type at all) the body is 1.0. A
missing ``Content-Encoding`` is taken as snappy, as Prometheus does; any other encoding is
refused. Snappy means the *block* format; the framed stream format is refused.

How it is fast (a gateway must sustain 250,000 samples/s on two cores): the body is parsed by
the C protobuf runtime through "twin" schemas (see ``wire/proto/messages.py``) that hand over
every label and sample of the request as flat lists; labels are resolved through a cache of
label bytes, samples are decoded with numpy, and all checks run on whole columns. When any check
fails, a plain per-series pass over the request finds the first offending series and raises the
error that names it: the slow path is only ever taken by requests that are rejected.

The work is split by job: ``remote_write_framing`` (headers, snappy),
``remote_write_columns`` (protobuf -> the long shape), ``remote_write_checks`` (the slow path and
its messages), ``remote_write_metadata`` (types and kinds), ``remote_write_v1``/``_v2``; this
module is the entry point. The encoder it mirrors is ``metricvault.wire.remote_write``.
"""

from __future__ import annotations

import re
from dataclasses import replace

from metricvault.ingest.protocols.decode_limits import DecodeBudget
from metricvault.ingest.protocols.remote_write_columns import (
    LABEL_CACHE,
    MAX_LABEL_CELLS,
    DecodedWrite,
    LabelPairCache,
    Limits,
    ResolvedSamples,
)
from metricvault.ingest.protocols.remote_write_framing import (
    check_encoding,
    decompress_snappy_block,
    negotiate_version,
)
from metricvault.ingest.protocols.remote_write_metadata import MetricMetadata
from metricvault.ingest.protocols.remote_write_v1 import decode_v1
from metricvault.ingest.protocols.remote_write_v2 import decode_v2
from metricvault.model import STALE_NAN_BITS
from metricvault.wire.remote_write import PROTO_V1, PROTO_V2

__all__ = [
    "MAX_LABEL_CELLS",
    "PROTO_V1",
    "PROTO_V2",
    "STALE_NAN_BITS",
    "DecodedWrite",
    "LabelPairCache",
    "MetricMetadata",
    "ResolvedSamples",
    "decode_remote_write",
    "decompress_snappy_block",
    "negotiate_version",
]


def decode_remote_write(
    body: bytes,
    *,
    content_type: str | None,
    content_encoding: str | None,
    version_header: str | None,
    max_decoded_bytes: int = 64 * 1024**2,
    max_series: int | None = None,
    max_label_names: int | None = None,
    time_budget_s: float | None = None,
    max_label_cells: int = MAX_LABEL_CELLS,
    label_cache: LabelPairCache | None = None,
    internal_label: str = "",
) -> DecodedWrite:
    """Decode one remote-write request body (1.0 or 2.0, snappy block compressed).

    Limits (``None``: none), each a ``TooLargeError`` (413) before the work it bounds:
    ``max_series`` time series, ``max_label_names`` distinct label names (the long shape has a
    cell per row and label name), ``time_budget_s`` seconds of this thread's CPU time,
    ``max_label_cells`` cells (rows x label names) of the long shape.

    ``label_cache``: where label bytes are remembered between requests (a
    :class:`LabelPairCache`); by default the one every decoder in the process shares. It never
    changes a result, only how fast a request repeating earlier labels decodes. Given one,
    the series cache of ``remote_write_known`` (series seen before, found by their label
    bytes) is not used: every label is resolved through ``label_cache``.

    ``internal_label``: a label name the caller takes off before storing, accepted even when it
    is reserved (``__``-prefixed): the gateway's HA replica label (``ha_replica_label``).
    """
    budget = DecodeBudget(time_budget_s)
    version = negotiate_version(content_type, version_header)
    check_encoding(content_encoding)
    raw = decompress_snappy_block(body, max_decoded_bytes)
    # The series cache never learns a series with a reserved ('__'-prefixed) label name, so a
    # series carrying a reserved internal label (the default ``__replica__``) always takes the
    # full path; any other name keeps a request out of the cache only if the body holds it.
    cacheable = not internal_label.startswith("__")
    if internal_label and cacheable and re.search(re.escape(internal_label.encode()), raw) is None:
        # no series carries it (label names are plain bytes in the body): decode as usual
        internal_label = ""
    cache = LABEL_CACHE if label_cache is None else label_cache
    limits = Limits(
        max_series, max_label_names, budget, max_label_cells, cache, internal_label=internal_label
    )
    if label_cache is not None or (internal_label and cacheable):
        # a label cache of the caller's own asks for the label-by-label path (tests start it
        # cold); a series with the internal label is not one the series cache may learn
        limits = replace(limits, known_series=False)
    if version == "1.0":
        return decode_v1(raw, limits)
    return decode_v2(raw, limits)
