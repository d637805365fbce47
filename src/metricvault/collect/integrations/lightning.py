"""``MetricvaultLogger``: a PyTorch Lightning logger (``lightning`` or ``pytorch_lightning``).

    trainer = L.Trainer(logger=MetricvaultLogger("llama-7b-lr3e-4", flops_per_token=6 * 7e9,
                                                 gpu="H100-SXM", gpus=8))

Metric keys become ``run.log`` names (``train/loss`` → ``train_loss``, LearningRateMonitor's
``lr-AdamW`` → ``learning_rate``); hyperparameters are merged into the experiment's params.
Each ``fit``/``test`` ends the experiment when it finishes (Lightning's ``finalize``); a later
``test`` continues it. Log a cumulative ``num_input_tokens_seen`` for throughput and mfu
(Lightning forwards only every ``log_every_n_steps``-th step, so per-step token counts would be
undercounted).
"""

from __future__ import annotations

from typing import Any

from metricvault.collect.integrations import forward_lightning_metrics, json_params
from metricvault.collect.training import Run, track

try:
    from lightning.pytorch.loggers.logger import (  # type: ignore[import-not-found, unused-ignore]
        Logger,
        rank_zero_experiment,
    )
    from lightning.pytorch.utilities import (  # type: ignore[import-not-found, unused-ignore]
        rank_zero_only,
    )
except ImportError:
    try:
        from pytorch_lightning.loggers.logger import (  # type: ignore[import-not-found, unused-ignore]
            Logger,
            rank_zero_experiment,
        )
        from pytorch_lightning.utilities import (  # type: ignore[import-not-found, unused-ignore]
            rank_zero_only,
        )
    except ImportError as exc:  # pragma: no cover - exercised only where Lightning is absent
        raise ImportError(
            "metricvault.collect.integrations.lightning needs PyTorch Lightning: "
            "pip install lightning"
        ) from exc


class MetricvaultLogger(Logger):  # type: ignore[misc, unused-ignore]
    """Records a Lightning run in a metricvault vault (rank 0 only, like Lightning's loggers)."""

    def __init__(self, experiment_id: str, **track_kwargs: Any) -> None:
        super().__init__()
        self._experiment_id = experiment_id
        self._track_kwargs = track_kwargs
        self._run: Run | None = None
        self._finalized = False  # fit() ended the run; test() after it reopens the experiment
        self._tokens_seen = 0.0
        self._last_step = 0

    @property
    def name(self) -> str:
        return "metricvault"

    @property
    def version(self) -> str:
        return self._experiment_id

    @property
    @rank_zero_experiment  # type: ignore[misc, untyped-decorator, unused-ignore]
    def experiment(self) -> Run:
        if self._run is None:
            self._run = track(self._experiment_id, reopen=self._finalized, **self._track_kwargs)
        return self._run

    @rank_zero_only  # type: ignore[misc, untyped-decorator, unused-ignore]
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.experiment.update_params(json_params(params))

    @rank_zero_only  # type: ignore[misc, untyped-decorator, unused-ignore]
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self._last_step = self._last_step if step is None else step
        self._tokens_seen = forward_lightning_metrics(
            self.experiment, metrics, self._last_step, tokens_seen=self._tokens_seen
        )

    @rank_zero_only  # type: ignore[misc, untyped-decorator, unused-ignore]
    def finalize(self, status: str) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
            self._finalized = True
