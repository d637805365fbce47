"""OTLP names -> Prometheus names, exactly as Prometheus's OTLP receiver builds them.

The rules are those of ``github.com/prometheus/otlptranslator`` (``metric_namer.go``,
``label_namer.go``, ``unit_namer.go``) under Prometheus's default translation strategy,
``UnderscoreEscapingWithSuffixes``:

- a metric name is split into tokens at every character outside ``[a-zA-Z0-9:]`` (so runs of
  ``.``, ``-`` and ``_`` become one ``_``, and leading/trailing ones go); the unit's suffix is
  appended unless a token already says it (``s`` -> ``seconds``, ``By/s`` ->
  ``bytes_per_second``, anything in ``{braces}`` is an annotation and adds nothing); monotonic
  counters get ``_total`` (moved to the end), gauges of unit ``1`` get ``_ratio``; a leading
  digit gets a ``_`` prefix;
- a label name has every run of characters outside ``[a-zA-Z0-9]`` (underscores included)
  replaced by one ``_`` (``__x__`` keeps its wrapping), a leading digit gets ``key_``;
- attribute values are written as pcommon's ``Value.AsString`` does (ints in decimal, doubles
  as ECMAScript prints numbers, bools ``true``/``false``, bytes in base64, arrays and maps as
  JSON); ``le`` and ``quantile`` values as Go's ``FormatFloat(v, 'f', -1, 64)``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from decimal import Decimal
from functools import lru_cache
from typing import Any

from metricvault.errors import LabelError

# OTLP unit (UCUM, c/s) -> Prometheus unit word (otlptranslator's unitMap)
UNIT_MAP = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
# the unit after '/' (otlptranslator's perUnitMap): "per second", singular
PER_UNIT_MAP = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}

GAUGE = "gauge"
COUNTER = "counter"  # a monotonic sum
NON_MONOTONIC = "non_monotonic_sum"  # stored as a gauge, named without _total
HISTOGRAM = "histogram"
SUMMARY = "summary"

_NOT_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9:]+")
_NOT_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9]+")
_INVALID_UNIT_CHARS = re.compile(r"[^a-zA-Z0-9:_]")
_UNDERSCORES = re.compile(r"__+")
_FAST_LABEL = re.compile(r"[a-zA-Z0-9_]+")


def _unit_suffixes(unit: str) -> tuple[str, str]:
    """(main, per) unit words: ``By/s`` -> ("bytes", "per_second"); annotations give ""."""
    main_otel, _, per_otel = unit.partition("/")
    main_otel, per_otel = main_otel.strip(), per_otel.strip()
    main = ""
    if main_otel and "{" not in main_otel and "}" not in main_otel:
        main = UNIT_MAP.get(main_otel, main_otel)
    per = ""
    if per_otel and "{" not in per_otel and "}" not in per_otel:
        per = PER_UNIT_MAP.get(per_otel, per_otel)
    return main, ("per_" + per if per else "")


def _clean_unit(word: str) -> str:
    return _UNDERSCORES.sub("_", _INVALID_UNIT_CHARS.sub("_", word)).removeprefix("_")


@lru_cache(maxsize=16384)
def metric_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus base name of an OTLP metric (before ``_bucket``/``_sum``/``_count``).

    Raises ``LabelError`` when nothing of the name is left (an empty or all-punctuation name).
    """
    tokens = [token for token in _NOT_METRIC_CHARS.split(name) if token]
    main, per = _unit_suffixes(unit)
    main, per = _clean_unit(main), _clean_unit(per)
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [word for word in (main, per) if word]
    if kind == COUNTER:
        tokens = [token for token in tokens if token != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [token for token in tokens if token != "ratio"] + ["ratio"]
    built = "_".join(tokens)
    if built and built[0].isdigit():
        built = "_" + built
    if not built or (built != name and not built.strip("_")):
        raise LabelError(
            f"metric name {json.dumps(name, ensure_ascii=False)} has no character Prometheus "
            "names can keep ([a-zA-Z0-9:]); give the instrument a name"
        )
    return built


@lru_cache(maxsize=16384)
def label_name(key: str) -> str:
    """The Prometheus label name of an attribute key; ``LabelError`` if none is left."""
    if not key:
        raise LabelError("an attribute has an empty key; give every attribute a name")
    if _FAST_LABEL.fullmatch(key) and "__" not in key and not key[0].isdigit() and key != "_":
        return key
    reserved = len(key) >= 4 and key.startswith("__") and key.endswith("__")
    inner = key[2:-2] if reserved else key
    built = _NOT_LABEL_CHARS.sub("_", inner)
    if reserved:
        built = f"__{built}__"
    if built[0].isdigit():
        built = "key_" + built
    if not built.strip("_"):
        raise LabelError(
            f"attribute key {json.dumps(key, ensure_ascii=False)} has no character a label "
            "name can keep ([a-zA-Z0-9]); rename the attribute"
        )
    return built


def attribute_value(value: Any) -> str:
    """An ``AnyValue`` as text, the way pcommon's ``Value.AsString`` writes it."""
    which = value.WhichOneof("value")
    if which is None:
        return ""
    if which == "string_value":
        return str(value.string_value)
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "int_value":
        return str(value.int_value)
    if which == "double_value":
        return ecmascript_number(value.double_value)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return json.dumps(_raw(value), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _raw(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_raw(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _raw(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if which == "double_value" and not math.isfinite(value.double_value):
        return ecmascript_number(value.double_value)
    return None if which is None else getattr(value, which)


def ecmascript_number(number: float) -> str:
    """``1.5``, ``100``, ``1e-7``, ``1e+21``: a double as JavaScript (and pcommon) prints it."""
    if math.isnan(number) or math.isinf(number):
        return (
            "json: unsupported value: "
            + {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(number)]
        )
    magnitude = abs(number)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        mantissa, _, exponent = repr(number).partition("e")
        mantissa = mantissa.removesuffix(".0")
        sign = "-" if exponent.startswith("-") else "+"
        return f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"
    return go_float(number)


def go_float(number: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: the shortest digits, never an exponent."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    text = format(Decimal(repr(number)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
