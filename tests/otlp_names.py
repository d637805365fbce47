"""Prometheus's OTLP metric-name translation (``otlptranslator``, strategy
``UnderscoreEscapingWithSuffixes``, Prometheus's default), written out for the tests that check
which series names an OpenTelemetry instrument becomes. Independent of metricvault's code: it
follows the rules of the OpenTelemetry-to-Prometheus compatibility spec, token by token."""

from __future__ import annotations

import re

# UCUM units Prometheus spells out (the common subset of otlptranslator's table)
UNITS = {
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
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week"}


def _unit_suffixes(unit: str) -> tuple[str, str]:
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_suffix = UNITS.get(main, main) if main and not set(main) & set("{}") else ""
    per_suffix = PER_UNITS.get(per, per) if per and not set(per) & set("{}") else ""
    return main_suffix, f"per_{per_suffix}" if per_suffix else ""


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name of an OTLP metric; ``kind``: ``counter`` (a monotonic sum),
    ``gauge`` (a gauge or a non-monotonic sum: otlptranslator's ``_ratio`` applies to real
    gauges only, see ``updowncounter``), ``updowncounter`` or ``histogram`` (the base name;
    the series add ``_bucket``, ``_sum``, ``_count``)."""
    tokens = [t for t in re.split(r"[^A-Za-z0-9:]+", name) if t]
    main, per = _unit_suffixes(unit)
    main = re.sub(r"[^A-Za-z0-9:]+", "_", main).strip("_")
    per = re.sub(r"[^A-Za-z0-9:]+", "_", per).strip("_")
    if main and main not in tokens:
        tokens.append(main)
    if per and per not in tokens:
        tokens.append(per)
    if kind == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    return "_" + out if out[:1].isdigit() else out
