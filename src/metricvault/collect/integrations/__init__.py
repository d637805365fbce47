"""Framework integrations: a Hugging Face ``TrainerCallback`` and a PyTorch Lightning ``Logger``
that forward what the framework logs to a :class:`~metricvault.collect.training.Run`.

    from metricvault.collect.integrations.huggingface import MetricvaultCallback
    from metricvault.collect.integrations.lightning import MetricvaultLogger

Those modules import their framework and fail with an ImportError naming the package to
install; the forwarding logic lives here, framework-free, so it is tested without them.

Both understand a cumulative ``num_input_tokens_seen`` (what the HF Trainer logs with
``include_num_input_tokens_seen=True``; log it the same way from Lightning): its increase since
the previous log becomes ``tokens=``, hence ``train_tokens_total``, ``tokens_per_second`` and
``mfu``. A per-step ``tokens`` value would be wrong there, since frameworks log only every N-th
step.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Mapping
from typing import Any, Protocol

TOKENS_SEEN = "num_input_tokens_seen"
# The HF Trainer's end-of-training summary carries this key; its ``train_loss`` is the mean over
# the whole run, not a point of the loss curve, so the summary is not forwarded.
HF_SUMMARY_KEY = "train_runtime"
_LIGHTNING_LR = re.compile(r"^lr-[A-Za-z0-9_]+$")  # LearningRateMonitor, one param group
_INVALID = re.compile(r"[^A-Za-z0-9_]")


class LogsTo(Protocol):
    """What the forwarders need of a Run (tests pass a recorder)."""

    def log(self, step: int, **values: Any) -> None: ...


def metric_key(key: str) -> str:
    """A framework's metric key as a ``run.log`` keyword: ``train/loss`` → ``train_loss``."""
    clean = _INVALID.sub("_", key)
    return f"_{clean}" if clean[:1].isdigit() else clean


def _numeric(value: Any) -> Any | None:
    """The value if it is a number or a one-element array/tensor, else None (strings, lists)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real) or callable(getattr(value, "item", None)):
        return value
    return None


def _tokens_delta(values: dict[str, Any], seen: Any, tokens_seen: float) -> float:
    """Turn a cumulative token count into ``tokens=`` (its increase); returns the new count.
    A count that went down (a restart from an older checkpoint) only resets the reference."""
    if seen is None:
        return tokens_seen
    count = float(seen.item() if callable(getattr(seen, "item", None)) else seen)
    if count >= tokens_seen:
        values["tokens"] = count - tokens_seen
    return count


def forward_hf_logs(
    run: LogsTo, global_step: int, logs: Mapping[str, Any], *, tokens_seen: float = 0.0
) -> float:
    """Forward one ``TrainerCallback.on_log`` dict at ``state.global_step``; returns the
    cumulative token count to pass as ``tokens_seen`` next time."""
    if HF_SUMMARY_KEY in logs:
        return tokens_seen
    values = {
        metric_key(k): v for k, v in logs.items() if k != TOKENS_SEEN and _numeric(v) is not None
    }
    tokens_seen = _tokens_delta(values, _numeric(logs.get(TOKENS_SEEN)), tokens_seen)
    if values:
        run.log(global_step, **values)
    return tokens_seen


def lightning_key(key: str) -> str:
    """``lr-AdamW`` (LearningRateMonitor) → ``lr``; others as :func:`metric_key`."""
    return "lr" if _LIGHTNING_LR.match(key) else metric_key(key)


def forward_lightning_metrics(
    run: LogsTo, metrics: Mapping[str, Any], step: int, *, tokens_seen: float = 0.0
) -> float:
    """Forward one ``Logger.log_metrics`` call; returns the cumulative token count."""
    values = {
        lightning_key(k): v
        for k, v in metrics.items()
        if k != TOKENS_SEEN and _numeric(v) is not None
    }
    tokens_seen = _tokens_delta(values, _numeric(metrics.get(TOKENS_SEEN)), tokens_seen)
    if values:
        run.log(step, **values)
    return tokens_seen


def json_params(params: Any) -> dict[str, Any]:
    """Hyperparameters (a mapping or an ``argparse.Namespace``) as JSON values for the
    experiment record: nested mappings stay nested, anything JSON cannot hold becomes its
    ``str``."""
    mapping = params if isinstance(params, Mapping) else vars(params)
    return {str(k): _json_value(v) for k, v in mapping.items()}


def _json_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value
