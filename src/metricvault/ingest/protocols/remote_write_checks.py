"""Remote-write's slow path: parse a rejected request plainly and name its first bad series.

The fast path (``remote_write_columns``) checks whole columns and only says *that* a rule is
broken (:class:`_Invalid`); these functions find *which* series breaks it and word the error.
Label names are judged by ``metricvault.model``'s one rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from metricvault.errors import InputError, LabelError, TooLargeError
from metricvault.model import METRIC_NAME_LABEL, METRIC_NAME_PATTERN, label_name_problem
from metricvault.wire.proto import messages
from metricvault.wire.remote_write import PROTO_V1, PROTO_V2

METRIC_NAME = re.compile(METRIC_NAME_PATTERN)
_MAX_SHOWN_VALUE = 60
Describe = Callable[[], str]  # renders the offending series, only when an error needs it


class _Invalid(Exception):
    """The fast path found a problem; the slow path finds it again and names the series."""


def parse(cls: Any, raw: memoryview, version: str) -> Any:
    name, twin = (
        (PROTO_V1, messages.WriteRequestBytes)
        if version == "1.0"
        else (PROTO_V2, messages.RequestBytes)
    )
    request = cls()
    try:
        request.ParseFromString(raw)
    except messages.DecodeError as exc:
        _raise_for_invalid_utf8(twin, raw, version)
        raise InputError(
            f"the decompressed body ({len(raw):,} bytes) is not a valid protobuf {name}: {exc}; "
            f"send a {name} message encoded with the remote-write {version} .proto, and the "
            f"Content-Type that names it"
        ) from exc
    return request


def _raise_for_invalid_utf8(twin: Any, raw: memoryview, version: str) -> None:
    """After a failed parse: if only UTF-8 was wrong, raise an error that says where."""
    request = twin()
    try:
        request.ParseFromString(raw)
    except messages.DecodeError:
        return  # malformed for other reasons too; the caller reports that
    if version == "2.0":
        for ref, symbol in enumerate(request.symbols):
            if not _is_utf8(symbol):
                raise LabelError(
                    f"symbol #{ref} ({_show_bytes(symbol)}) is not valid UTF-8; every string "
                    f"in a remote-write request must be UTF-8: fix the sender's labels"
                )
        return
    for index, series in enumerate(request.timeseries):
        pairs = [(label.name, label.value) for label in series.labels]
        describe = partial(_describe_bytes, index, pairs)
        _check_utf8_labels(pairs, describe, "label")
        for number, exemplar in enumerate(series.exemplars):
            labels = [(label.name, label.value) for label in exemplar.labels]
            _check_utf8_labels(labels, describe, f"exemplar #{number}'s label")
    for index, entry in enumerate(request.metadata):
        for part in ("metric_family_name", "help", "unit"):
            text = getattr(entry, part)
            if not _is_utf8(text):
                raise InputError(
                    f"metadata entry #{index} ({_show_bytes(entry.metric_family_name)}): its "
                    f"{part} ({_show_bytes(text)}) is not valid UTF-8; every string in a "
                    f"remote-write request must be UTF-8: fix the sender's metadata"
                )


def _check_utf8_labels(pairs: list[tuple[bytes, bytes]], describe: Describe, what: str) -> None:
    for position, (name, value) in enumerate(pairs):
        for part, text in (("name", name), ("value", value)):
            if not _is_utf8(text):
                raise LabelError(
                    f"{describe()}: the {part} of {what} #{position} ({_show_bytes(text)}) is "
                    f"not valid UTF-8; every string in a remote-write request must be UTF-8: fix "
                    f"the sender's labels"
                )


def _is_utf8(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_series_count(count: int, max_series: int | None) -> None:
    if max_series is not None and count > max_series:
        raise TooLargeError(
            f"the request holds {count:,} time series, over the limit of {max_series:,} per "
            f"request (max_series_per_request); nothing was stored: send smaller batches "
            f"(Prometheus: lower queue_config.max_samples_per_send) or raise "
            f"max_series_per_request"
        )


def check_series(
    names: Sequence[str],
    values: Sequence[str | None],
    describe: Describe,
    internal_label: str = "",
) -> None:
    previous = ""
    for position, name in enumerate(names):
        allowed = name == METRIC_NAME_LABEL or bool(internal_label and name == internal_label)
        problem = None if allowed else label_name_problem(name)
        if problem is not None:
            raise LabelError(f"{describe()}: {problem}")
        if position and name <= previous:
            problem = "is duplicated" if name == previous else f"comes after {previous!r}"
            raise LabelError(
                f"{describe()}: label {name!r} {problem}; labels must be unique and sorted by "
                f"name, as the remote-write spec requires: sort and de-duplicate them before "
                f"sending"
            )
        previous = name
    if "__name__" not in names:
        raise LabelError(
            f"{describe()}: the series has no __name__ label; every series needs a metric "
            f"name: add __name__ (or fix the relabel rule that dropped it)"
        )
    metric = values[list(names).index("__name__")]
    if not metric:
        raise LabelError(
            f"{describe()}: the __name__ label is empty; every series needs a metric name "
            f"matching {METRIC_NAME_PATTERN}"
        )
    if METRIC_NAME.fullmatch(metric) is None:
        raise LabelError(
            f"{describe()}: metric name {show(metric)} is invalid; metric names must match "
            f"{METRIC_NAME_PATTERN} (replace other characters with '_')"
        )


def unexplained(version: str) -> InputError:  # pragma: no cover - fast and slow paths agree
    return InputError(
        f"the remote-write {version} request was rejected, but no single series could be "
        f"blamed; check that the sender follows the remote-write {version} specification"
    )


def describe(index: int, names: Sequence[str], values: Sequence[str | None]) -> str:
    """``series #3 up{job="x"}``: the index, and the series as PromQL would show it."""
    pairs = {name: value or "" for name, value in zip(names, values, strict=True)}
    metric = pairs.pop("__name__", "")
    shown = ",".join(f"{name}={show(value)}" for name, value in pairs.items())
    return f"series #{index} {_show_metric(metric)}{{{shown}}}"


def _describe_bytes(index: int, pairs: Sequence[tuple[bytes, bytes]]) -> str:
    names = [name.decode("utf-8", "replace") for name, _ in pairs]
    values = [value.decode("utf-8", "replace") for _, value in pairs]
    return describe(index, names, values)


def _show_metric(metric: str) -> str:
    return metric if not metric or METRIC_NAME.fullmatch(metric) else show(metric)


def show(text: str) -> str:
    """A quoted, escaped, length-capped rendering for error messages."""
    suffix = f"...({len(text):,} chars)" if len(text) > _MAX_SHOWN_VALUE else ""
    return json.dumps(text[:_MAX_SHOWN_VALUE], ensure_ascii=False) + suffix


def _show_bytes(raw: bytes) -> str:
    shown = raw[:_MAX_SHOWN_VALUE]
    suffix = f"...({len(raw):,} bytes)" if len(raw) > _MAX_SHOWN_VALUE else ""
    return f"{shown!r}{suffix}"
