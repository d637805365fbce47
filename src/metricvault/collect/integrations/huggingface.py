"""``MetricvaultCallback``: a Hugging Face ``transformers`` Trainer callback.

    trainer = Trainer(..., callbacks=[MetricvaultCallback("llama-7b-lr3e-4",
                                                          flops_per_token=6 * 7e9, gpu="H100-SXM")])

The callback starts the run when training begins (on the main process only) and ends it when
training ends. To also record ``trainer.evaluate()`` afterwards, pass a run you manage:
``with metricvault.track(...) as run: trainer = Trainer(..., callbacks=[MetricvaultCallback(
run=run)]); trainer.train(); trainer.evaluate()``.
"""

from __future__ import annotations

from typing import Any

from metricvault.collect.integrations import forward_hf_logs
from metricvault.collect.training import Run, track

try:
    from transformers import TrainerCallback  # type: ignore[import-not-found, unused-ignore]
except ImportError as exc:  # pragma: no cover - exercised only where transformers is absent
    raise ImportError(
        "metricvault.collect.integrations.huggingface needs Hugging Face transformers: "
        "pip install transformers"
    ) from exc


class MetricvaultCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Forwards the Trainer's logs (loss, learning_rate, grad_norm, eval_*, and tokens from
    ``num_input_tokens_seen``) to a metricvault run."""

    def __init__(
        self, experiment_id: str | None = None, *, run: Run | None = None, **track_kwargs: Any
    ) -> None:
        if (experiment_id is None) == (run is None):
            raise ValueError("MetricvaultCallback needs an experiment id or run=, not both")
        self.experiment_id = experiment_id
        self.run = run
        self._owns_run = run is None
        self._track_kwargs = track_kwargs
        self._tokens_seen = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if self.run is None and self.experiment_id is not None:
            self.run = track(self.experiment_id, **self._track_kwargs)
        # Resuming from a checkpoint restores the count; only what is trained now is new.
        self._tokens_seen = float(getattr(state, "num_input_tokens_seen", 0) or 0)

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.run is None or not state.is_world_process_zero or not logs:
            return
        self._tokens_seen = forward_hf_logs(
            self.run, state.global_step, logs, tokens_seen=self._tokens_seen
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._owns_run and self.run is not None:
            self.run.close()
            self.run = None
