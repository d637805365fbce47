"""metricvault.track: experiment record, series, throughput and mfu, the non-blocking queue,
the peak table, and the framework forwarders."""

from __future__ import annotations

import argparse
import getpass
import importlib
import importlib.util
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from metricvault.collect.integrations import (
    forward_hf_logs,
    forward_lightning_metrics,
    json_params,
    metric_key,
)
from metricvault.collect.peaks import PEAK_BF16_DENSE_FLOPS, canonical_gpu, peak_flops_for
from metricvault.collect.training import series_name, track
from metricvault.errors import ConflictError, InputError
from metricvault.store.vault import Vault
from tests.clocks import Clocks

pytestmark = pytest.mark.usefixtures("no_nvml")
ID = "llama-7b-lr3e-4"


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()  # 1 ms per reading


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    v = Vault.open_local(str(tmp_path / "vault"))
    yield v
    v.close()


def _series(vault: Vault, experiment_id: str = ID) -> dict[str, list[float]]:
    """Each metric's values in time order, for one experiment."""
    frame = vault.query(f'{{experiment="{experiment_id}"}}', "-1d", "+1d")
    frame = frame.sort_values("timestamp", kind="stable")
    return {str(m): list(g["value"]) for m, g in frame.groupby("metric")}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid",
         "-c", "commit.gpgsign=false", *args],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh git repository with one commit, as the current directory."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "--quiet")
    (root / "train.py").write_text("print('train')\n")
    _git(root, "add", "train.py")
    _git(root, "commit", "--quiet", "-m", "first")
    _git(root, "remote", "add", "origin", "https://git.example.invalid/lab/llm.git")
    monkeypatch.chdir(root)
    return root


def _messages(caught: list[warnings.WarningMessage], text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


# ---------------------------------------------------------------------------- peaks
@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("H100-SXM", "H100-SXM"),
        ("H100 SXM", "H100-SXM"),
        ("h100-sxm", "H100-SXM"),
        ("h100sxm5", "H100-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("AMD Instinct MI300X", "MI300X"),
        ("mi250x", "MI250X"),
        # unknown or ambiguous: never a guess
        ("NVIDIA A10G", None),  # not an A10
        ("H100", None),  # SXM, PCIe and NVL differ
        ("Tesla V100-SXM2-32GB", None),
        ("", None),
    ],
)
def test_gpu_spellings(spelling: str, canonical: str | None) -> None:
    assert canonical_gpu(spelling) == canonical


def test_peak_values_are_dense_bf16() -> None:
    assert peak_flops_for("H100 SXM") == 989.4e12
    assert peak_flops_for("NVIDIA H200") == 989.4e12
    assert peak_flops_for("A100 PCIe") == peak_flops_for("A100-SXM") == 312e12
    assert peak_flops_for("h100 pcie") == 756e12
    assert peak_flops_for("A10G") is None
    assert all(1e13 < v < 1e16 for v in PEAK_BF16_DENSE_FLOPS.values())


# ---------------------------------------------------------------------------- mfu, tokens
def test_mfu_tokens_per_second_and_cumulative_tokens(vault: Vault, clocks: Clocks) -> None:
    with track(
        ID, **clocks.kw, data=vault, flops_per_token=6 * 7e9, gpu="H100-SXM", gpus=8, git=False
    ) as run:
        clocks[0] += 2.0
        run.log(0, loss=3.0, tokens=48_000)  # the first call: nothing to measure from
        clocks[0] += 1.0
        run.log(1, loss=2.9)  # no tokens: the rate's reference time stays at the last tokens=
        clocks[0] += 1.0
        run.log(2, loss=2.8, tokens=48_000)  # 48,000 tokens in the 2 s since step 0
        clocks[0] += 0.5
        run.log(3, tokens=6_000)
    got = _series(vault)
    assert got["train_tokens_total"] == [48_000, 96_000, 102_000]
    assert got["tokens_per_second"] == [24_000, 12_000]
    # PaLM appendix B: 24,000 tokens/s x 42 GFLOP/token / (8 x 989.4 TFLOP/s) = 0.127350...
    assert got["mfu"] == pytest.approx([0.12734990903, 0.06367495452], rel=1e-10)
    assert got["mfu"][0] == 24_000 * 42e9 / (8 * 989.4e12)
    assert got["train_step"] == [0, 1, 2, 3]
    assert got["train_loss"] == [3.0, 2.9, 2.8]


@pytest.mark.parametrize(
    ("calls", "rates"),
    [
        # a first step logged at once after a long start-up (loading, compiling): no rate,
        # not 1,000 tokens over the start-up; the next one is measured from it
        ([(60.0, 1000), (0.5, 1000), (0.5, 1000)], [2000.0, 2000.0]),
        ([(60.0, 1000)], []),  # one call only: no rate at all
        # a first tokens= after a log call without tokens: measured from that call
        ([(60.0, None), (2.0, 1000), (1.0, 500)], [500.0, 500.0]),
    ],
)
def test_throughput_is_measured_from_the_previous_log_call_never_from_track(
    vault: Vault, clocks: Clocks, calls: list[tuple[float, int | None]], rates: list[float]
) -> None:
    with track(
        ID, **clocks.kw, data=vault, flops_per_token=1e9, peak_flops=1e12, gpus=1, git=False
    ) as run:
        for step, (wait, tokens) in enumerate(calls):
            clocks[0] += wait
            if tokens is None:
                run.log(step, loss=1.0)
            else:
                run.log(step, tokens=tokens)
    got = _series(vault)
    assert got.get("tokens_per_second", []) == rates
    assert got.get("mfu", []) == [r * 1e9 / 1e12 for r in rates]  # no MFU sample without one


def test_explicit_mfu_and_peak_override(vault: Vault, clocks: Clocks) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with track(
            ID, **clocks.kw, data=vault, flops_per_token=1e9, gpu="A10G", peak_flops=1e12
        ) as run:
            run.log(0, tokens=100)  # the first: no rate
            clocks[0] += 1.0
            run.log(1, tokens=100)  # 100 tokens/s x 1e9 / 1e12
            clocks[0] += 1.0
            run.log(2, tokens=100, mfu=0.5)  # given explicitly: wins
    assert not _messages(caught, "mfu will not be recorded")
    assert _series(vault)["mfu"] == [0.1, 0.5]
    assert run.experiment.params["peak_flops"] == 1e12


@pytest.mark.parametrize("gpu", ["A10G", "H100", None])
def test_unknown_gpu_warns_once_and_writes_no_mfu(
    vault: Vault, clocks: Clocks, gpu: str | None
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with track(ID, **clocks.kw, data=vault, flops_per_token=6 * 7e9, gpu=gpu, git=False) as run:
            for step in range(5):
                clocks[0] += 1.0
                run.log(step, tokens=1000)
    assert len(_messages(caught, "mfu will not be recorded")) == 1
    got = _series(vault)
    assert "mfu" not in got
    assert got["tokens_per_second"] == [1000.0] * 4  # the first call has none
    assert not run.mfu_enabled


def test_no_warning_when_mfu_is_not_asked_for(vault: Vault) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        track(ID, data=vault, gpu="A10G", git=False).close()
    assert not _messages(caught, "mfu")


# ---------------------------------------------------------------------------- series
class FakeTensor:
    """What run.log sees of a 0-d torch tensor, without torch."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.detached = False

    def detach(self) -> FakeTensor:
        copy = FakeTensor(self.value)
        copy.detached = True
        return copy

    def clone(self) -> FakeTensor:
        copy = FakeTensor(self.value)
        copy.detached = self.detached
        return copy

    def numel(self) -> int:
        return 1

    def item(self) -> float:
        assert self.detached, "read only after detach()"
        return self.value


def test_series_names_labels_values_and_kinds(vault: Vault, clocks: Clocks) -> None:
    with track(ID, **clocks.kw, data=vault, labels={"rank": "0"}, git=False) as run:
        clocks[0] += 1.0
        run.log(
            np.int64(7),
            loss=FakeTensor(2.5),
            lr=np.float32(0.5),
            grad_norm=np.array(1.25),
            tokens=np.int64(10),
            accuracy=0.75,
            eval_loss=3,
            train_perplexity=12.0,
        )
    got = _series(vault)
    assert got == {
        "train_step": [7.0],
        "train_loss": [2.5],
        "learning_rate": [0.5],
        "grad_norm": [1.25],
        "train_tokens_total": [10.0],  # a first call: no tokens_per_second
        "train_accuracy": [0.75],
        "eval_loss": [3.0],
        "train_perplexity": [12.0],
    }
    series = vault.series(f'{{experiment="{ID}"}}')
    assert set(series["experiment"]) == {ID}
    assert set(series["host"]) == {socket.gethostname()}
    assert set(series["rank"]) == {"0"}
    kinds = dict(zip(series["metric"], series["kind"], strict=True))
    assert kinds["train_tokens_total"] == "counter"
    assert kinds["train_loss"] == "gauge"


def test_tensors_are_read_in_the_writer_as_logged(vault: Vault, clocks: Clocks) -> None:
    running_loss = FakeTensor(2.0)
    with track(ID, **clocks.kw, data=vault, git=False, flush_interval_s=60) as run:
        run.log(0, loss=running_loss)
        running_loss.value = 0.0  # an in-place update (``running_loss.zero_()``) after logging
        run.log(1, loss=running_loss)
    assert _series(vault)["train_loss"] == [2.0, 0.0]


@pytest.mark.parametrize(
    ("name", "series"),
    [("loss", "train_loss"), ("lr", "learning_rate"), ("learning_rate", "learning_rate"),
     ("grad_norm", "grad_norm"), ("mfu", "mfu"), ("x", "train_x"), ("val_acc", "val_acc")],
)  # fmt: skip
def test_series_name_mapping(name: str, series: str) -> None:
    assert series_name(name) == series


def test_bad_log_calls_fail_fast(vault: Vault) -> None:
    with track(ID, data=vault, git=False) as run:
        with pytest.raises(ValueError, match="train_step is written from the step"):
            run.log(0, train_step=1)
        with pytest.raises(ValueError, match="not a valid metric name"):
            run.log(0, **{"lösung": 1.0})
        with pytest.raises(TypeError, match="must be a number"):
            run.log(0, loss="low")
        with pytest.raises(TypeError, match="one number"):
            run.log(0, loss=np.array([1.0, 2.0]))
        with pytest.raises(ValueError, match="tokens must be"):
            run.log(0, tokens=-5)
    with pytest.raises(RuntimeError, match="closed"):
        run.log(1, loss=1.0)


def test_non_finite_values_are_skipped_and_counted(vault: Vault, clocks: Clocks) -> None:
    with track(ID, **clocks.kw, data=vault, git=False) as run:
        run.log(0, loss=float("nan"), grad_norm=1.0)
        run.log(1, loss=float("inf"), grad_norm=2.0)
        run.log(2, loss=1.5, grad_norm=3.0)
    got = _series(vault)
    assert got["train_loss"] == [1.5]
    assert got["grad_norm"] == [1.0, 2.0, 3.0]
    assert run.skipped == 2


# ---------------------------------------------------------------------------- not blocking
def test_log_returns_while_the_vault_is_stuck_in_a_write(
    vault: Vault, clocks: Clocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Behaviour, not speed: every log call completes while the writer thread is still inside
    # its first vault.write. A log that waited for the writer would let that write return
    # (the gate times out) before the loop ends, and the count below would say so.
    entered, gate = threading.Event(), threading.Event()
    returned: list[int] = []
    real_write = vault.write

    def stuck_write(data: Any, kinds: Any = None, **kw: Any) -> int:
        entered.set()
        gate.wait(10)
        returned.append(1)
        return real_write(data, kinds, **kw)

    monkeypatch.setattr(vault, "write", stuck_write)
    with track(ID, **clocks.kw, data=vault, git=False, flush_interval_s=0.01) as run:
        run.log(0, loss=1.0, lr=1e-4, tokens=100)
        assert entered.wait(10), "the writer thread never called vault.write"
        for step in range(1, 2000):
            run.log(step, loss=1.0, lr=1e-4, tokens=100)
        assert returned == [], "a log call waited for the vault's write to finish"
        gate.set()
    assert run.dropped == 0
    assert len(_series(vault)["train_step"]) == 2000


def test_full_queue_drops_the_oldest_and_counts(
    vault: Vault, clocks: Clocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_write = vault.write

    def blocked_write(data: Any, kinds: Any = None, **kw: Any) -> int:
        gate.wait(10)
        return real_write(data, kinds, **kw)

    monkeypatch.setattr(vault, "write", blocked_write)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = track(ID, **clocks.kw, data=vault, git=False, max_queue=10, flush_interval_s=0.01)
        for step in range(100):
            run.log(step, loss=float(step))
        gate.set()
        run.close()
    steps = set(_series(vault)["train_step"])
    assert set(range(90, 100)) <= steps  # the newest survive
    assert run.dropped == 100 - len(steps) > 0
    assert len(_messages(caught, "log queue is full")) == 1
    assert len(_messages(caught, "log call(s) dropped")) == 1


def test_failed_writes_are_retried(
    vault: Vault, clocks: Clocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = vault.write
    failures = iter([OSError("disk briefly gone")])

    def flaky_write(data: Any, kinds: Any = None, **kw: Any) -> int:
        for exc in failures:
            raise exc
        return real_write(data, kinds, **kw)

    monkeypatch.setattr(vault, "write", flaky_write)
    with track(ID, **clocks.kw, data=vault, git=False, flush_interval_s=60) as run:
        run.log(0, loss=1.0)
        run.flush()  # fails: kept
        run.log(1, loss=0.5)
    assert _series(vault)["train_loss"] == [1.0, 0.5]
    assert run.lost == 0


# ---------------------------------------------------------------------------- the record
def test_experiment_record(repo: Path, tmp_path: Path, clocks: Clocks) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = track(
            ID,
            **clocks.kw,
            name="LLaMA 7B, lr 3e-4",
            data=tmp_path / "vault",
            flops_per_token=6 * 7e9,
            gpu="NVIDIA H100 80GB HBM3",
            gpus=8,
            tags=("sweep", "lr"),
            notes="baseline",
            params={"lr": 3e-4, "batch": 1024},
        )
    assert not _messages(caught, "uncommitted")
    with run:
        running = run.vault.experiments.get(ID)
        assert running.end_ms is None
        run.log(0, loss=1.0)
    with Vault.open_local(str(tmp_path / "vault")) as vault:
        exp = vault.experiments.get(ID)
        assert _series(vault)["train_loss"] == [1.0]
    assert exp.selector == f'{{experiment="{ID}"}}'
    assert exp.name == "LLaMA 7B, lr 3e-4"
    assert exp.git_sha == _git(repo, "rev-parse", "HEAD")
    assert exp.git_repo == "https://git.example.invalid/lab/llm.git"
    assert exp.owner == getpass.getuser()
    assert exp.tags == ("sweep", "lr")
    assert exp.notes == "baseline"
    assert exp.params == {
        "lr": 3e-4,
        "batch": 1024,
        "host": socket.gethostname(),
        "gpu": "H100-SXM",
        "gpus": 8,
        "peak_flops": 989.4e12,
        "flops_per_token": 6 * 7e9,
    }
    assert exp.end_ms is not None and exp.end_ms > exp.start_ms


def test_dirty_tree_warns(repo: Path, vault: Vault) -> None:
    (repo / "train.py").write_text("print('changed')\n")
    with pytest.warns(RuntimeWarning, match="uncommitted changes"):
        run = track(ID, data=vault)
    run.close()
    assert run.experiment.git_sha == _git(repo, "rev-parse", "HEAD")


def test_no_repository_warns_and_git_false_skips(
    tmp_path: Path, vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.warns(RuntimeWarning, match="no git commit recorded"):
        track(ID, data=vault).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        track("other-run", data=vault, git=False, owner="bob").close()
    assert vault.experiments.get("other-run").git_sha == ""
    assert vault.experiments.get("other-run").owner == "bob"


def test_exception_in_the_block_flushes_ends_and_propagates(vault: Vault, clocks: Clocks) -> None:
    with pytest.raises(ZeroDivisionError), track(ID, **clocks.kw, data=vault, git=False) as run:
        run.log(0, loss=4.0)
        _ = 1 / 0
    assert vault.experiments.get(ID).end_ms is not None
    assert _series(vault)["train_loss"] == [4.0]


def test_running_experiment_is_continued(vault: Vault, clocks: Clocks) -> None:
    first = vault.experiments.create(
        ID, '{experiment="llama-7b-lr3e-4"}', start="-1h", tags=["a"], params={"lr": 1}
    )
    with track(
        ID, **clocks.kw, data=vault, git=False, tags=("b",), params={"resumed": True}
    ) as run:
        run.log(100, loss=1.0)
    exp = vault.experiments.get(ID)
    assert exp.start_ms == first.start_ms
    assert exp.tags == ("a", "b")
    assert exp.params["lr"] == 1 and exp.params["resumed"] is True
    assert exp.end_ms is not None


def test_ended_experiment_is_refused_unless_reopened(vault: Vault, clocks: Clocks) -> None:
    with track(ID, **clocks.kw, data=vault, git=False) as run:
        run.log(0, loss=2.0)
    with pytest.raises(ConflictError, match="ended; a new run needs a new id"):
        track(ID, **clocks.kw, data=vault, git=False)
    with track(ID, **clocks.kw, data=vault, git=False, reopen=True) as run:
        assert vault.experiments.get(ID).end_ms is None
        run.log(1, loss=1.0)
    assert _series(vault)["train_loss"] == [2.0, 1.0]
    assert vault.experiments.get(ID).end_ms is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"experiment_id": "../etc"}, InputError, "looks like a path"),
        ({"experiment_id": ID, "gpus": 0}, ValueError, "gpus=0"),
        ({"experiment_id": ID, "peak_flops": -1.0}, ValueError, "peak_flops"),
        ({"experiment_id": ID, "labels": {"experiment": "x"}}, ValueError, "reserved"),
    ],
)
def test_bad_track_arguments(
    vault: Vault, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        track(data=vault, git=False, **kwargs)
    assert vault.experiments.ids() == []


def test_update_params(vault: Vault) -> None:
    with track(ID, data=vault, git=False, params={"a": 1}) as run:
        run.update_params({"b": [1, 2]})
    assert vault.experiments.get(ID).params["a"] == 1
    assert vault.experiments.get(ID).params["b"] == [1, 2]


def test_import_is_light() -> None:
    code = (
        "import sys, metricvault.collect.training; "
        "print(any(m.startswith(('matplotlib', 'torch', 'transformers')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------- integrations
class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, Any]]] = []

    def log(self, step: int, **values: Any) -> None:
        self.calls.append((step, values))


def test_forward_hf_logs() -> None:
    rec = Recorder()
    logs = {"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.9, "epoch": 0.5,
            "num_input_tokens_seen": 5000, "note": "text"}  # fmt: skip
    seen = forward_hf_logs(rec, 10, logs, tokens_seen=1000)
    assert seen == 5000
    assert rec.calls == [
        (10, {"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.9, "epoch": 0.5, "tokens": 4000})
    ]
    summary = {"train_runtime": 100.0, "train_loss": 2.0, "total_flos": 1e18}
    assert forward_hf_logs(rec, 20, summary, tokens_seen=seen) == 5000
    forward_hf_logs(rec, 20, {"eval_loss": 2.2, "eval_runtime": 3.0})
    assert rec.calls[-1] == (20, {"eval_loss": 2.2, "eval_runtime": 3.0})
    assert len(rec.calls) == 2  # the summary was not forwarded


def test_forward_lightning_metrics() -> None:
    rec = Recorder()
    metrics = {"train/loss": 1.0, "lr-AdamW": 1e-3, "val_loss": 2.0, "epoch": 1.0,
               "num_input_tokens_seen": 300.0, "flag": True}  # fmt: skip
    assert forward_lightning_metrics(rec, metrics, 5) == 300
    assert rec.calls == [
        (5, {"train_loss": 1.0, "lr": 1e-3, "val_loss": 2.0, "epoch": 1.0, "tokens": 300.0})
    ]
    # a count that went down (restart from an older checkpoint) resets the reference only
    assert (
        forward_lightning_metrics(rec, {"num_input_tokens_seen": 100.0}, 6, tokens_seen=300) == 100
    )
    assert len(rec.calls) == 1


def test_forwarded_logs_reach_the_vault(vault: Vault, clocks: Clocks) -> None:
    with track(ID, **clocks.kw, data=vault, git=False) as run:
        clocks[0] += 1.0
        forward_hf_logs(run, 3, {"loss": 2.0, "learning_rate": 0.1, "num_input_tokens_seen": 64})
        forward_lightning_metrics(run, {"train/acc": 0.5, "lr-SGD": 0.2, "epoch": 0.0}, 4)
        clocks[0] += 2.0
        forward_hf_logs(run, 5, {"loss": 1.5, "num_input_tokens_seen": 192}, tokens_seen=64)
    got = _series(vault)
    assert got["train_loss"] == [2.0, 1.5]
    assert got["learning_rate"] == [0.1, 0.2]
    assert got["train_acc"] == [0.5]
    assert got["train_epoch"] == [0.0]
    assert got["tokens_per_second"] == [64.0]  # 128 tokens in the 2 s since the first tokens=
    assert got["train_step"] == [3.0, 4.0, 5.0]


def test_json_params_and_metric_keys() -> None:
    ns = argparse.Namespace(lr=3e-4, layers=[1, 2], path=Path("/data"), nested={"a": {1: None}})
    assert json_params(ns) == {
        "lr": 3e-4,
        "layers": [1, 2],
        "path": "/data",
        "nested": {"a": {"1": None}},
    }
    assert json_params({"nan": float("nan")}) == {"nan": "nan"}
    assert metric_key("train/loss") == "train_loss"
    assert metric_key("1st") == "_1st"


@pytest.mark.parametrize(
    ("module", "package", "hint"),
    [("huggingface", "transformers", "pip install transformers"),
     ("lightning", "lightning", "pip install lightning")],
)  # fmt: skip
def test_integrations_say_what_to_install(module: str, package: str, hint: str) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    if package == "lightning" and importlib.util.find_spec("pytorch_lightning") is not None:
        pytest.skip("pytorch_lightning is installed")
    with pytest.raises(ImportError, match=hint):
        importlib.import_module(f"metricvault.collect.integrations.{module}")


def test_every_log_call_is_kept_even_within_one_millisecond(vault: Vault) -> None:
    """A tight loop logs many steps per millisecond; each gets its own timestamp."""
    with track(ID, data=vault, git=False) as run:
        for step in range(200):
            run.log(step, loss=float(step))
    series = _series(vault)
    assert series["train_step"] == [float(s) for s in range(200)]
    assert series["train_loss"] == [float(s) for s in range(200)]


def test_track_into_an_open_store_checks_what_it_can_do(vault: Vault, tmp_path: Path) -> None:
    """An open store is taken by what it can do (collect names no backend class): a read-only
    snapshot is refused with the store's own message, and left open for its caller."""
    import metricvault
    from metricvault.archive.snapshot import export_snapshot
    from metricvault.errors import UnsupportedError

    with track(ID, data=vault, git=False) as run:
        run.log(1, loss=0.5)
    info = export_snapshot(vault, ID, tmp_path / "out")
    snapshot = metricvault.open(info.path)
    with pytest.raises(UnsupportedError, match=r"cannot do writing samples.*supports read"):
        track("next-run", data=snapshot, git=False)  # type: ignore[arg-type]
    assert not snapshot.query("train_loss", "-1d", "+1d").empty  # still open: not closed
    snapshot.close()
