"""Metric families without prometheus-client: what the agent's sources yield.

prometheus-client cannot be imported without ``ssl``, ``http.server`` and ``wsgiref`` (its
package ``__init__`` loads its exposition), ~14 MB of RSS in a fresh interpreter, more than
half of the edge agent's 25 MB budget (``docs/agent.md``). The sources therefore build their
families from these classes, which have the same constructor arguments, attributes and sample
tuples as ``prometheus_client.core``'s (``name``, ``documentation``, ``type``, ``unit``,
``samples`` of ``Sample(name, labels, value, timestamp, exemplar, native_histogram)``), so the
full agent hands them to prometheus-client's registry and exposition unchanged (custom
collectors are duck-typed there), and the edge agent (``metricvault.collect.edge``) reads the
samples directly, never importing prometheus-client.

Only what the sources use is here: gauges, counters (``_total`` appended to the sample name,
as prometheus-client does) and plain families with ``add_sample``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["CounterMetricFamily", "GaugeMetricFamily", "InfoMetricFamily", "Metric", "Sample"]


class Sample(NamedTuple):
    """One sample, field for field ``prometheus_client.samples.Sample``."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None
    native_histogram: Any = None


class Metric:
    """A metric family: its name, help text, type and samples."""

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.unit = unit
        self.samples: list[Sample] = []

    def add_sample(
        self,
        name: str,
        labels: dict[str, str],
        value: float,
        timestamp: float | None = None,
        exemplar: Any = None,
        native_histogram: Any = None,
    ) -> None:
        self.samples.append(Sample(name, labels, value, timestamp, exemplar, native_histogram))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Metric) and (
            self.name,
            self.documentation,
            self.type,
            self.unit,
            self.samples,
        ) == (other.name, other.documentation, other.type, other.unit, other.samples)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"Metric({self.name!r}, {self.type!r}, {len(self.samples)} samples)"


class _LabelledFamily(Metric):
    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        labels: Sequence[str] | None,
        unit: str,
    ) -> None:
        super().__init__(name, documentation, typ, unit)
        self._labelnames = tuple(labels or ())

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self.name}: {len(self._labelnames)} label values needed")
        return dict(zip(self._labelnames, values, strict=True))


class GaugeMetricFamily(_LabelledFamily):
    """``prometheus_client.core.GaugeMetricFamily``'s subset: ``value`` or ``labels``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        unit: str = "",
    ) -> None:
        super().__init__(name, documentation, "gauge", labels, unit)
        if value is not None:
            self.add_metric([], value)

    def add_metric(
        self, labels: Sequence[str], value: float, timestamp: float | None = None
    ) -> None:
        self.add_sample(self.name, self._labels(labels), float(value), timestamp)


class CounterMetricFamily(_LabelledFamily):
    """``prometheus_client.core.CounterMetricFamily``'s subset: a trailing ``_total`` is taken
    off the family's name and put on its samples' names."""

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        unit: str = "",
    ) -> None:
        if name.endswith("_total"):
            name = name[: -len("_total")]
        super().__init__(name, documentation, "counter", labels, unit)
        if value is not None:
            self.add_metric([], value)

    def add_metric(
        self, labels: Sequence[str], value: float, timestamp: float | None = None
    ) -> None:
        self.add_sample(self.name + "_total", self._labels(labels), float(value), timestamp)


class InfoMetricFamily(_LabelledFamily):
    """``prometheus_client.core.InfoMetricFamily``'s subset: one ``<name>_info`` sample of
    value 1 per label set."""

    def __init__(
        self,
        name: str,
        documentation: str,
        value: Mapping[str, str] | None = None,
        labels: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, documentation, "info", labels, "")
        if value is not None:
            self.add_metric([], value)

    def add_metric(
        self, labels: Sequence[str], value: Mapping[str, str], timestamp: float | None = None
    ) -> None:
        self.add_sample(self.name + "_info", {**self._labels(labels), **value}, 1.0, timestamp)
