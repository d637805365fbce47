"""Prometheus rule files evaluated over the vault, as Prometheus 2.42 evaluates them.

Above the store, like the server: rules read only through the PromQL engine over the read seam
(:class:`metricvault.protocols.SampleSource`) and write recorded series and ``ALERTS`` through
the store's write protocol.

- :func:`load_rule_files` (``files.py``): rule files in Prometheus's format, refused in
  ``promtool check rules``'s words; returns :class:`RuleGroup` objects.
- :class:`RuleGroup` (``group.py``): ``evaluate(at_ms, query, write)`` runs one round and
  returns an :class:`EvaluationResult` (samples written, :class:`OutgoingAlert` to send);
  ``on_alerts(hook)`` hears each round's alerts; ``eval_timestamp(now_ms)`` aligns rounds.
- :class:`RuleManager` (``manager.py``): the groups of a set of files over one store, run on
  schedule, reloaded, ``for`` state restored (``state.py``).
- ``templates.py``: Go text/template as Prometheus renders alert labels and annotations.
- ``unittest.py``: ``promtool test rules`` files run against this evaluator.
- ``lease.py``: one evaluator per vault.
"""

from __future__ import annotations

from collections.abc import Iterable

from metricvault.rules.files import (
    DEFAULT_EVALUATION_INTERVAL_MS,
    GroupSpec,
    RuleSpec,
    check_rule_file,
    expand_rule_paths,
    read_rule_files,
)
from metricvault.rules.group import (
    Alert,
    AlertingRule,
    EvaluationResult,
    OutgoingAlert,
    RecordingRule,
    RuleGroup,
    engine_query,
)

__all__ = [
    "Alert",
    "AlertingRule",
    "EvaluationResult",
    "GroupSpec",
    "OutgoingAlert",
    "RecordingRule",
    "RuleGroup",
    "RuleSpec",
    "check_rule_file",
    "engine_query",
    "expand_rule_paths",
    "load_rule_files",
]


def load_rule_files(
    patterns: Iterable[str], default_interval_ms: int = DEFAULT_EVALUATION_INTERVAL_MS
) -> list[RuleGroup]:
    """The groups of every rule file the paths or globs name, ready to evaluate;
    :class:`RuleFileError` (promtool's words) if any file is invalid, and nothing loaded."""
    return [RuleGroup(spec, default_interval_ms) for spec in read_rule_files(patterns)]
