"""The training-loop API: ``metricvault.track`` registers an experiment and ``run.log`` records
its series without ever slowing the loop down.

    import metricvault
    with metricvault.track("llama-7b-lr3e-4", flops_per_token=6 * 7e9, gpu="H100-SXM") as run:
        for step, batch in enumerate(loader):
            ...
            run.log(step, loss=loss, lr=lr, grad_norm=gn, tokens=batch_tokens)

Series written (names match the simulator and ``metricvault.archive.compare``), every one with
the labels ``experiment="<id>"`` and ``host="<hostname>"``:

    run.log argument      series                 notes
    step (positional)     train_step             the step itself
    loss=                 train_loss
    lr= / learning_rate=  learning_rate
    grad_norm=            grad_norm
    tokens=               train_tokens_total     cumulative in this process (a counter)
                          tokens_per_second      tokens ÷ seconds since the previous log call
                                                 that gave ``tokens=`` (for the first one, the
                                                 previous log call); none for a first call
                          mfu                    tokens_per_second * flops_per_token /
                                                 (gpus * peak FLOP/s), a fraction; only when
                                                 both are known
    mfu= / tokens_per_second=  same names        given explicitly, they win over computed ones
    anything else, x=     train_x                names starting ``train_``, ``eval_``, ``val_``
                                                 or ``test_`` are kept as they are

An experiment id that already exists and is still running (no end: a run that crashed or was
preempted and now resumes from a checkpoint) is *continued*: its start, selector, name and git
commit stay, the new params and tags are merged in, and a different git commit gives a warning.
An id whose experiment has ended is refused (ConflictError): a new run needs a new id, or
``reopen=True`` to append to the finished experiment (its end is cleared, then set again).

Through OpenTelemetry instead (``track(..., otel=True)``, ``meter_provider=`` or ``meter=``):
the experiment is still registered in ``data``, the series are recorded on Gauges and a Counter
(``metricvault.collect.otel``) that the app's exporter sends, e.g. by OTLP to the gateway's
``/v1/metrics``: the same series names there, one value per export interval.

Call ``track`` in one process per run (rank 0 under DDP/FSDP, with ``gpus`` = the world size
when it logs the global batch's tokens); other processes would end the experiment on exit too.
"""

from __future__ import annotations

import atexit
import getpass
import logging
import math
import numbers
import os
import socket
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat

from metricvault.collect.peaks import PEAK_BF16_DENSE_FLOPS, canonical_gpu, peak_flops_for
from metricvault.durations import now_ms
from metricvault.errors import ArchiveError, ConflictError, InputError
from metricvault.model import is_metric_name, label_name_problem

if TYPE_CHECKING:
    from metricvault.experiment import Experiment
    from metricvault.protocols import ExperimentRegistry, TrackingStore

log = logging.getLogger(__name__)

STEP = "train_step"
TOKENS_TOTAL = "train_tokens_total"
TOKENS_PER_SECOND = "tokens_per_second"
MFU = "mfu"
# ``run.log`` names with a series name of their own; everything else becomes ``train_<name>``.
SERIES_NAMES = {
    "loss": "train_loss",
    "lr": "learning_rate",
    "learning_rate": "learning_rate",
    "grad_norm": "grad_norm",
    MFU: MFU,
    TOKENS_PER_SECOND: TOKENS_PER_SECOND,
}
KEPT_PREFIXES = ("train_", "eval_", "val_", "test_")  # already say which phase they measure
RESERVED = frozenset({STEP, TOKENS_TOTAL})  # written from ``step`` and ``tokens`` only
KINDS = {TOKENS_TOTAL: "counter"}


class SeriesNamesNotice(UserWarning):
    """Said once per run, at the first ``run.log`` that stores a keyword under another name
    (``loss`` -> ``train_loss``): query those names. Silence it with
    ``warnings.filterwarnings("ignore", category=SeriesNamesNotice)``."""


_Entry = tuple[int, dict[str, Any]]  # (ts ms, series -> float or a detached tensor)
_Sample = tuple[str, dict[str, str], int, float]


class SampleRecorder(Protocol):
    """Where a run's samples go: the vault (:class:`VaultSamples`) or an OpenTelemetry meter
    (``metricvault.collect.otel.OtelSamples``)."""

    def check(self, series: str) -> None:
        """Raise ValueError when ``series`` cannot be recorded under that name."""

    def write(self, samples: list[_Sample], kinds: Mapping[str, str]) -> None: ...

    def flush(self) -> None:
        """Deliver what was written (before the experiment's end is set)."""


class VaultSamples:
    """The default recorder: ``vault.write`` (the vault or the gateway's remote_write)."""

    def __init__(self, vault: TrackingStore) -> None:
        self.vault = vault

    def check(self, series: str) -> None:
        pass  # series_name already holds names to the vault's rule

    def write(self, samples: list[_Sample], kinds: Mapping[str, str]) -> None:
        self.vault.write(samples, kinds=kinds)

    def flush(self) -> None:
        pass  # write returned once the vault had the samples


def series_name(name: str) -> str:
    """The series a ``run.log`` keyword is written to (see the module docstring)."""
    metric = SERIES_NAMES.get(name) or (name if name.startswith(KEPT_PREFIXES) else f"train_{name}")
    if metric in RESERVED:
        raise ValueError(
            f"run.log({name}=...): {metric} is written from the step argument and tokens=; "
            "pass those instead"
        )
    if not is_metric_name(metric):
        raise ValueError(
            f"run.log({name}=...): {metric!r} is not a valid metric name; use ASCII letters, "
            "digits and '_' in logged names"
        )
    return metric


def eager_number(name: str, value: Any) -> float:
    """A Python/numpy number or anything with ``.item()`` (0-d arrays/tensors) as a float."""
    if isinstance(value, numbers.Real):  # Python and numpy scalars
        return float(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return float(item())
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"run.log: {name} must hold one number: {exc}") from exc
    raise TypeError(
        f"run.log: {name} must be a number, a numpy scalar or a 0-d tensor, "
        f"not {type(value).__name__}"
    )


def logged_value(name: str, value: Any) -> Any:
    """A float, or a copy of a one-element tensor read later by the writer thread: reading a
    CUDA tensor waits for the GPU, which the training loop must not. ``detach`` drops the
    autograd graph (the queue must not keep activations alive); ``clone`` (an asynchronous
    device copy) keeps the value from changing when the loop updates the tensor in place."""
    if isinstance(value, numbers.Real):
        return float(value)
    detach = getattr(value, "detach", None)
    if callable(detach):
        numel = getattr(value, "numel", None)
        if callable(numel) and numel() != 1:
            raise TypeError(f"run.log: {name} must be a one-element tensor, got {numel()} elements")
        copy = detach()
        clone = getattr(copy, "clone", None)
        return clone() if callable(clone) else copy
    return eager_number(name, value)


class Run:
    """One tracked training run: ``log`` queues, a background thread writes every
    ``flush_interval_s``. Made by :func:`track`; close it (or use ``with``) to flush and end
    the experiment.

    Counters: ``dropped`` (log calls discarded, oldest first, because the queue was full),
    ``written`` (samples stored), ``skipped`` (NaN/Inf or unreadable values, never stored) and
    ``lost`` (samples the vault refused or that exceeded the retry bound).
    """

    def __init__(
        self,
        vault: TrackingStore,
        experiment: Experiment,
        labels: Mapping[str, str],
        *,
        flops_per_token: float | None = None,
        peak_flops_total: float | None = None,
        flush_interval_s: float = 2.0,
        max_queue: int = 100_000,
        owns_vault: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = now_ms,
        recorder: SampleRecorder | None = None,
    ) -> None:
        # Two clocks, injectable for tests: the wall clock stamps samples, the monotonic one
        # measures throughput (immune to NTP steps).
        self._clock = clock
        self._wall_clock_ms = wall_clock_ms
        self.vault = vault
        self.recorder = VaultSamples(vault) if recorder is None else recorder
        self._checked: set[str] = set()
        self.experiment = experiment
        self.labels = dict(labels)
        self.flops_per_token = flops_per_token
        self.peak_flops_total = peak_flops_total  # gpus x peak of one GPU
        self.dropped = self.written = self.skipped = self.lost = 0
        self._interval = flush_interval_s
        self._max_queue = max_queue
        self._owns_vault = owns_vault
        self._queue: deque[_Entry] = deque()
        self._retry: list[_Sample] = []
        self._lock = threading.Lock()  # the queue and counters the loop touches
        self._write_lock = threading.Lock()  # one batch in flight at a time
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._closed = False
        self._warned: set[str] = set()
        self._tokens_total = 0.0
        # when the previous log call with tokens= / of any kind happened: throughput is
        # measured from there, never from track() (start-up before the first step is no step)
        self._tokens_mono: float | None = None
        self._log_mono: float | None = None
        self._last_ts = 0
        self._last_queued_ts = 0
        self._thread = threading.Thread(
            target=self._write_loop, name=f"metricvault-track-{experiment.id}", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)  # a forgotten close() still flushes at interpreter exit

    @property
    def experiment_id(self) -> str:
        return self.experiment.id

    @property
    def mfu_enabled(self) -> bool:
        return bool(self.flops_per_token and self.peak_flops_total)

    # ------------------------------------------------------------------ the loop's side
    def log(self, step: int | SupportsFloat, **values: Any) -> None:
        """Queue one step's values; returns at once (see the module docstring for names)."""
        if self._closed:
            raise RuntimeError(f"run {self.experiment_id!r} is closed; log before closing it")
        ts, mono = self._wall_clock_ms(), self._clock()
        series: dict[str, Any] = {STEP: eager_number("step", step)}
        tokens = values.pop("tokens", None)
        renamed = {}
        for name, value in values.items():
            metric = series_name(name)
            if metric not in self._checked:
                self.recorder.check(metric)
                self._checked.add(metric)
            series[metric] = logged_value(name, value)
            if metric != name:
                renamed[name] = metric
        if tokens is not None:
            for metric, number in self._throughput(eager_number("tokens", tokens), mono).items():
                series.setdefault(metric, number)  # an explicit mfu= / tokens_per_second= wins
        self._log_mono = mono
        self._check_mfu(series.get(MFU))
        if renamed and "names" not in self._warned:
            self._say_names(renamed)
        self._enqueue(ts, series)

    def _say_names(self, renamed: dict[str, str]) -> None:
        """Once per run: a query for ``loss`` would find nothing, so say what it is called."""
        self._warned.add("names")
        pairs = ", ".join(f"{name} -> {metric}" for name, metric in renamed.items())
        warnings.warn(
            f"metricvault run {self.experiment_id!r} stores run.log names as series {pairs} "
            f"(and the step as {STEP}); query those names, e.g. "
            f'vault.history("{self.experiment_id}", metrics=["{next(iter(renamed.values()))}"])',
            SeriesNamesNotice,
            stacklevel=3,
        )

    def _check_mfu(self, mfu: Any) -> None:
        """MFU above 1 is impossible: the FLOPs per token, the GPU or the GPU count is wrong.
        The value is still stored (a wrong constant can be corrected afterwards)."""
        if not isinstance(mfu, float) or mfu <= 1 or "mfu above 1" in self._warned:
            return
        params = self.experiment.params
        self._warn_once(
            "mfu above 1",
            f"metricvault run {self.experiment_id!r}: mfu {mfu:.3g} is above 1 (more FLOP/s "
            f"than the GPUs' peak): check flops_per_token={self.flops_per_token or 0:.4g} "
            f"(about 6 x parameters), gpu={params.get('gpu')!r} (peak "
            f"{params.get('peak_flops', 0):.4g} FLOP/s each) and gpus={params.get('gpus')!r} "
            "(all GPUs whose tokens are logged)",
        )

    def _throughput(self, tokens: float, mono: float) -> dict[str, float]:
        if tokens < 0 or not math.isfinite(tokens):
            raise ValueError(f"run.log: tokens must be a finite count >= 0, got {tokens}")
        self._tokens_total += tokens
        derived = {TOKENS_TOTAL: self._tokens_total}
        since = self._tokens_mono if self._tokens_mono is not None else self._log_mono
        self._tokens_mono = mono
        # A first call has nothing to measure from: no rate rather than tokens over the time
        # since track() (model loading, compilation), which inflated the first MFU ~100x.
        elapsed = mono - since if since is not None else 0.0
        if elapsed > 0:
            tokens_per_second = derived[TOKENS_PER_SECOND] = tokens / elapsed
            if self.flops_per_token and self.peak_flops_total:  # PaLM appendix B
                achieved_flops = tokens_per_second * self.flops_per_token
                derived[MFU] = achieved_flops / self.peak_flops_total
        return derived

    def _enqueue(self, ts: int, series: dict[str, Any]) -> None:
        with self._lock:
            # two logs in one millisecond would be one sample (a series holds one value per
            # timestamp): each log gets its own, at most a few ms late in a tight loop
            ts = self._last_queued_ts = max(ts, self._last_queued_ts + 1)
            overflow = len(self._queue) >= self._max_queue
            if overflow:  # never block the loop: the oldest pending entry goes
                self._queue.popleft()
                self.dropped += 1
            self._queue.append((ts, series))
            half_full = len(self._queue) >= self._max_queue // 2
        if overflow:
            self._warn_once(
                "dropped",
                f"metricvault run {self.experiment_id!r}: the log queue is full "
                f"(max_queue={self._max_queue}); the oldest entries are dropped (see run.dropped)",
            )
        if half_full:
            self._wake.set()

    # ------------------------------------------------------------------ the writer's side
    def _write_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            self._write_pending()

    def flush(self) -> None:
        """Write everything queued so far (blocks until the vault has it)."""
        self._write_pending()

    def _write_pending(self) -> None:
        with self._write_lock:
            with self._lock:
                entries, self._queue = self._queue, deque()
            samples = self._retry + self._samples(entries)
            self._retry = []
            if samples:
                self._store(samples)

    def _samples(self, entries: Iterable[_Entry]) -> list[_Sample]:
        out: list[_Sample] = []
        for ts, series in entries:
            for metric, value in series.items():
                number = self._number(metric, value)
                if number is not None:
                    out.append((metric, self.labels, ts, number))
            self._last_ts = max(self._last_ts, ts)
        return out

    def _number(self, metric: str, value: Any) -> float | None:
        try:
            number = value if isinstance(value, float) else float(value.item())
        except Exception as exc:  # a tensor that cannot be read: skip it, keep the rest
            self.skipped += 1
            self._log_once(f"read {metric}", f"cannot read a {metric} value: {exc}")
            return None
        if not math.isfinite(number):  # the vault refuses NaN/Inf (a diverged loss)
            self.skipped += 1
            self._log_once(f"nonfinite {metric}", f"non-finite {metric} values are not stored")
            return None
        return number

    def _store(self, samples: list[_Sample]) -> None:
        try:
            self.recorder.write(samples, KINDS)
        except InputError as exc:  # can never succeed as sent: retrying would repeat it
            self.lost += len(samples)
            log.error(
                "run %r: the vault refused %d samples: %s", self.experiment_id, len(samples), exc
            )
        except Exception as exc:  # storage trouble: kept for the next interval, bounded
            self._retry = samples[-self._max_queue :]
            self.lost += len(samples) - len(self._retry)
            log.warning(
                "run %r: writing to the vault failed, will retry: %s", self.experiment_id, exc
            )
        else:
            self.written += len(samples)

    def _warn_once(self, key: str, message: str) -> None:
        """A warning for the training loop's thread, pointing at its ``run.log`` call."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _log_once(self, key: str, message: str) -> None:
        """The writer thread's counterpart: a log line (no user frame to point a warning at)."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning("run %r: %s", self.experiment_id, message)

    # ------------------------------------------------------------------ the end
    def update_params(self, params: Mapping[str, Any]) -> None:
        """Merge ``params`` (JSON values) into the experiment record, e.g. hyperparameters
        known only after ``track`` started."""
        current = self.vault.experiments.get(self.experiment_id)
        merged = {**current.params, **params}
        self.experiment = self.vault.experiments.update(self.experiment_id, params=merged)

    def close(self) -> None:
        """Flush, set the experiment's end and close the vault (if ``track`` opened it)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        try:
            self._write_pending()
            if self._retry:
                self._write_pending()  # one last try for what failed in the loop
            self._report_lost()
            self.recorder.flush()
            end = max(self._wall_clock_ms(), self._last_ts + 1, self.experiment.start_ms + 1)
            self.experiment = self.vault.experiments.end(self.experiment_id, end)
        finally:
            if self._owns_vault:
                self.vault.close()

    def _report_lost(self) -> None:
        self.lost += len(self._retry)
        self._retry = []
        if self.lost or self.dropped:
            warnings.warn(
                f"metricvault run {self.experiment_id!r}: {self.dropped} log call(s) dropped "
                f"(full queue), {self.lost} sample(s) not stored; see the log for why",
                RuntimeWarning,
                stacklevel=3,
            )

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()  # an exception still flushes and ends the experiment, then propagates


# ---------------------------------------------------------------------------- starting
def track(
    experiment_id: str,
    *,
    name: str | None = None,
    flops_per_token: float | None = None,
    gpu: str | None = None,
    gpus: int = 1,
    peak_flops: float | None = None,
    data: str | os.PathLike[str] | TrackingStore | None = None,
    selector: str | None = None,
    owner: str | None = None,
    tags: Iterable[str] = (),
    notes: str = "",
    params: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    git: bool = True,
    reopen: bool = False,
    flush_interval_s: float = 2.0,
    max_queue: int = 100_000,
    clock: Callable[[], float] = time.monotonic,
    wall_clock_ms: Callable[[], int] = now_ms,
    otel: bool = False,
    meter_provider: Any = None,
    meter: Any = None,
) -> Run:
    """Start (or continue) experiment ``experiment_id`` and return its :class:`Run`.

    ``run.log(step, loss=..., lr=..., tokens=...)`` stores series named as in the module
    docstring: the step as ``train_step``, ``loss=`` as ``train_loss``, ``lr=`` as
    ``learning_rate``, any other ``x=`` as ``train_x`` (``grad_norm``, ``mfu`` and names
    starting ``train_``/``eval_``/``val_``/``test_`` keep theirs); the first ``run.log`` that
    renames says so once (:class:`SeriesNamesNotice`). Read them back with
    ``vault.history(experiment_id, metrics=["train_loss"])``. An mfu above 1 warns once.

    ``flops_per_token``: model FLOPs per trained token (about 6 x parameters, for mfu).
    ``gpu``: the GPU model ("H100-SXM", "NVIDIA H100 80GB HBM3", ...; default: asked from NVML
    when ``flops_per_token`` is given); ``gpus``: how many GPUs the logged tokens cover;
    ``peak_flops``: one GPU's peak FLOP/s, overriding the table. ``data``: vault directory or
    URI (default: the settings' ``data``), a gateway's ``http(s)://host:port`` (the experiment
    is registered and the series sent through ``metricvault serve``; a bearer token from
    ``METRICVAULT_GATEWAY_TOKEN``), or an open store that writes and keeps experiments (a
    :class:`Vault`, an InfluxVault; left open on close).
    ``selector``: the experiment's series (default ``{experiment="<id>"}``). ``labels``: extra
    labels on every series (e.g. ``{"rank": "0"}``). ``git``: record the current directory's
    repository commit (a dirty tree warns). ``reopen``: continue the experiment even if it
    has ended (its end is cleared; e.g. a test phase after training). ``clock`` (monotonic
    seconds, for tokens/s) and ``wall_clock_ms`` (sample timestamps) replace the system clocks,
    e.g. in tests. ``otel=True`` (the global meter provider), ``meter_provider=`` or ``meter=``:
    record the series through OpenTelemetry (``pip install 'metricvault[otel]'``) instead of
    writing them to ``data``, which still registers the experiment; close flushes the provider.
    """
    from metricvault.experiment import validate_id

    validate_id(experiment_id)
    _check_options(gpus, flops_per_token, peak_flops, flush_interval_s, max_queue)
    peak, gpu_name = resolve_peak(gpu, peak_flops, flops_per_token)
    recorder = _otel_recorder(otel, meter_provider, meter)
    host = socket.gethostname()
    run_labels = _labels(experiment_id, host, labels)
    hardware: dict[str, Any] = {"host": host, "gpu": gpu_name, "gpus": gpus, "peak_flops": peak}
    hardware["flops_per_token"] = flops_per_token
    record: dict[str, Any] = {
        "selector": selector or f'{{experiment="{experiment_id}"}}',
        "name": name or "",
        "owner": _owner() if owner is None else owner,
        "tags": tuple(tags),
        "notes": notes,
        "params": {**{k: v for k, v in hardware.items() if v is not None}, **(params or {})},
        **_git_fields(git),
    }
    vault, owns_vault = _open_vault(data)
    try:
        experiment = _register(vault.experiments, experiment_id, record, reopen)
    except BaseException:
        if owns_vault:
            vault.close()
        raise
    return Run(
        vault,
        experiment,
        run_labels,
        flops_per_token=flops_per_token,
        peak_flops_total=peak * gpus if peak else None,
        flush_interval_s=flush_interval_s,
        max_queue=max_queue,
        owns_vault=owns_vault,
        clock=clock,
        wall_clock_ms=wall_clock_ms,
        recorder=recorder,
    )


def _otel_recorder(otel: bool, meter_provider: Any, meter: Any) -> SampleRecorder | None:
    """The OpenTelemetry recorder when asked for (None: the vault's), made before the
    experiment is registered so that a missing extra or a wrong argument changes nothing."""
    if not (otel or meter_provider is not None or meter is not None):
        return None
    from metricvault.collect.otel import samples_recorder  # the optional extra, only here

    return samples_recorder(__name__, meter_provider, meter)


def _check_options(
    gpus: int,
    flops_per_token: float | None,
    peak_flops: float | None,
    flush_interval_s: float,
    max_queue: int,
) -> None:
    positive = {
        "gpus": gpus,
        "flops_per_token": flops_per_token,
        "peak_flops": peak_flops,
        "flush_interval_s": flush_interval_s,
        "max_queue": max_queue,
    }
    for key, value in positive.items():
        if value is not None and not (isinstance(value, int | float) and value > 0):
            raise ValueError(f"track({key}={value!r}): must be a number > 0")


def resolve_peak(
    gpu: str | None, peak_flops: float | None, flops_per_token: float | None
) -> tuple[float | None, str | None]:
    """(one GPU's peak FLOP/s or None, the GPU's name) — warning once when mfu was asked for
    (``flops_per_token``) but cannot be computed."""
    if peak_flops is not None:
        return float(peak_flops), gpu
    name = gpu if gpu is not None or flops_per_token is None else detect_gpu_name()
    peak = peak_flops_for(name) if name else None
    if peak is None and flops_per_token is not None:
        why = f"no peak FLOP/s is known for GPU {name!r}" if name else "the GPU model is unknown"
        warnings.warn(
            f"mfu will not be recorded: {why}. Pass gpu= (one of {', '.join(PEAK_BF16_DENSE_FLOPS)}"
            ") or peak_flops= (one GPU's dense BF16 FLOP/s)",
            RuntimeWarning,
            stacklevel=3,
        )
    return peak, (canonical_gpu(name) or name) if name else None


def detect_gpu_name() -> str | None:
    """This machine's GPU model through NVML when all its GPUs are one model, else None."""
    try:
        import pynvml  # type: ignore[import-untyped, unused-ignore]

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        names = {_text(pynvml.nvmlDeviceGetName(h)) for h in handles}
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()
    return names.pop() if len(names) == 1 else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _labels(experiment_id: str, host: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    extra = dict(extra or {})
    for key in extra:
        if key == "experiment":
            raise ValueError(
                "track(labels=...): 'experiment' is reserved here: the run sets it "
                "to the experiment id; name the label otherwise"
            )
        problem = label_name_problem(key)  # the store's rule: refused now, not on every write
        if problem is not None:
            raise ValueError(f"track(labels=...): {problem}")
    return {"experiment": experiment_id, "host": host, **{k: str(v) for k, v in extra.items()}}


def _owner() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # containers with a uid missing from /etc/passwd
        return ""


def _git_fields(enabled: bool) -> dict[str, str]:
    """The current directory's repository and HEAD commit; warnings, never errors."""
    if not enabled:
        return {}
    from metricvault.gitinfo import head, repo_root

    try:
        root = repo_root(Path.cwd())
        sha, origin, dirty = head(root)
    except ArchiveError as exc:
        warnings.warn(
            f"no git commit recorded for this run ({exc}); pass git=False to skip",
            RuntimeWarning,
            stacklevel=3,
        )
        return {}
    if dirty:
        warnings.warn(
            f"the git working tree {root} has uncommitted changes: commit {sha[:12]} alone does "
            "not reproduce this run; commit before training",
            RuntimeWarning,
            stacklevel=3,
        )
    return {"git_repo": origin or str(root), "git_sha": sha}


def _open_vault(
    data: str | os.PathLike[str] | TrackingStore | None,
) -> tuple[TrackingStore, bool]:
    from metricvault.open import open as open_store
    from metricvault.protocols import require

    if data is not None and not isinstance(data, str | os.PathLike):
        # a store the caller opened (and closes): checked by capability, so collect needs no
        # backend class, and a snapshot or other read-only store is refused here, clearly
        for capability in ("write", "experiments"):
            require(data, capability)
        return data, False
    # a run writes samples and registers itself (a gateway URL opens the gateway client):
    # a snapshot is refused here, clearly
    path = None if data is None else os.fspath(data)
    return open_store(path, need="write+experiments"), True


def _register(
    experiments: ExperimentRegistry,
    experiment_id: str,
    record: dict[str, Any],
    reopen: bool,
) -> Experiment:
    """Create the experiment, or continue it when it exists and has not ended (or ``reopen``)."""
    try:
        return experiments.create(experiment_id, **record)
    except ConflictError:
        pass  # exists (maybe created by a concurrent process a moment ago)
    current = experiments.get(experiment_id)
    if current.end_ms is not None and not reopen:
        raise ConflictError(
            f"experiment {experiment_id!r} already ran and ended; a new run needs a new id "
            f"(e.g. {experiment_id + '-r2'!r}), or pass reopen=True to append to it"
        )
    sha = record.get("git_sha", "")
    if sha and current.git_sha and sha != current.git_sha:
        warnings.warn(
            f"experiment {experiment_id!r} started at commit {current.git_sha[:12]} and continues "
            f"at {sha[:12]}; the record keeps the first",
            RuntimeWarning,
            stacklevel=3,
        )
    tags = tuple(dict.fromkeys((*current.tags, *record["tags"])))
    params = {**current.params, **record["params"]}
    return experiments.update(experiment_id, tags=tags, params=params, end=None)
