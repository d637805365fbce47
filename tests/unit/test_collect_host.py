"""Host metrics (psutil, node_exporter names), the log watcher and the agent's counter state."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metricvault.collect.logwatch import CounterState, LogWatcher, parse_patterns
from metricvault.collect.sources import host
from metricvault.collect.sources.host import HostSource, host_load


# ---------------------------------------------------------------------- fakes and helpers
class Part(NamedTuple):
    device: str
    mountpoint: str
    fstype: str
    opts: str = "rw"


class Usage(NamedTuple):
    total: int
    used: int
    free: int
    percent: float


class DiskIO(NamedTuple):
    read_count: int
    write_count: int
    read_bytes: int
    write_bytes: int
    busy_time: int  # milliseconds


class NetIO(NamedTuple):
    bytes_sent: int
    bytes_recv: int
    packets_sent: int
    packets_recv: int
    errin: int
    errout: int
    dropin: int
    dropout: int


PARTS = [
    Part("/dev/sda1", "/", "ext4"),
    Part("/dev/sdb1", "/secret", "xfs"),
    Part("/dev/sda1", "/", "ext4"),  # bind mount listed twice: reported once
    Part("overlay", "/var/lib/docker/x", "overlay"),
]
PSEUDO_PARTS = [Part("tmpfs", "/run", "tmpfs"), Part("proc", "/proc", "proc")]


@pytest.fixture
def fake_disks_and_nics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic disks, filesystems and NICs; CPU, memory and load stay real."""

    def partitions(all: bool = False) -> list[Part]:
        return PARTS + (PSEUDO_PARTS if all else [])

    def usage(path: str) -> Usage:
        if path == "/secret":
            raise PermissionError(13, "Permission denied", path)
        return Usage(total=1000, used=300, free=600, percent=30.0)

    disks = {
        "sda": DiskIO(1, 2, 512, 1024, 1500),
        "sda1": DiskIO(1, 2, 512, 1024, 1500),
        "nvme0n1": DiskIO(3, 4, 4096, 8192, 250),
        "nvme0n1p1": DiskIO(3, 4, 4096, 8192, 250),
        "loop0": DiskIO(9, 9, 9, 9, 9),
        "zram0": DiskIO(9, 9, 9, 9, 9),
    }
    nics = {"lo": NetIO(*range(8)), "eth0": NetIO(10, 20, 30, 40, 1, 2, 3, 4)}
    monkeypatch.setattr(psutil, "disk_partitions", partitions)
    monkeypatch.setattr(psutil, "disk_usage", usage)
    monkeypatch.setattr(psutil, "disk_io_counters", lambda perdisk=False: disks)
    monkeypatch.setattr(psutil, "net_io_counters", lambda pernic=False: nics)


def scrape(*collectors: Any) -> tuple[str, dict[str, Any]]:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    text = generate_latest(registry).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def values(family: Any, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in family.samples
        if all(s.labels.get(k) == v for k, v in match.items())
    }


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------- HostSource
COUNTERS = {
    "node_cpu_seconds",
    "node_disk_read_bytes",
    "node_disk_written_bytes",
    "node_disk_reads_completed",
    "node_disk_writes_completed",
    "node_disk_io_time_seconds",
    *(
        f"node_network_{d}_{k}"
        for d in ("receive", "transmit")
        for k in ("bytes", "packets", "errs", "drop")
    ),
}
GAUGES = {
    "node_cpu_utilization_ratio",
    "node_load1",
    "node_load5",
    "node_load15",
    "node_memory_MemTotal_bytes",
    "node_memory_MemAvailable_bytes",
    "node_memory_MemFree_bytes",
    "node_memory_SwapTotal_bytes",
    "node_memory_SwapFree_bytes",
    "node_filesystem_size_bytes",
    "node_filesystem_avail_bytes",
    "node_filesystem_free_bytes",
}


@pytest.mark.usefixtures("fake_disks_and_nics")
def test_host_names_types_and_values() -> None:
    text, families = scrape(HostSource())
    for name in COUNTERS:
        assert families[name].type == "counter", name
        assert f"# TYPE {name}_total counter" in text
        assert {s.name for s in families[name].samples} == {f"{name}_total"}
    for name in GAUGES:
        assert families[name].type == "gauge", name
    assert "_created" not in text

    mem = families["node_memory_MemTotal_bytes"].samples[0]
    assert mem.labels == {}  # Prometheus adds `instance` when it scrapes
    assert mem.value == psutil.virtual_memory().total

    cpu = families["node_cpu_seconds"]
    assert len({s.labels["cpu"] for s in cpu.samples}) == psutil.cpu_count()
    assert {s.labels["mode"] for s in cpu.samples} >= {"user", "system", "idle"}
    assert "guest" not in {s.labels["mode"] for s in cpu.samples}  # already inside user
    assert 0.0 <= families["node_cpu_utilization_ratio"].samples[0].value <= 1.0
    assert families["node_load1"].samples[0].value == pytest.approx(os.getloadavg()[0], abs=1.0)


@pytest.mark.usefixtures("fake_disks_and_nics")
def test_host_disks_and_network_follow_node_exporter() -> None:
    _, families = scrape(HostSource())
    # Whole disks only: loop, zram and partitions are excluded like node_exporter does.
    read = values(families["node_disk_read_bytes"])
    assert read == {(("device", "nvme0n1"),): 4096.0, (("device", "sda"),): 512.0}
    busy = values(families["node_disk_io_time_seconds"], device="sda")
    assert list(busy.values()) == [1.5]
    rx = values(families["node_network_receive_bytes"])
    assert rx == {(("device", "eth0"),): 20.0}  # lo skipped
    assert values(families["node_network_transmit_drop"]) == {(("device", "eth0"),): 4.0}


@pytest.mark.usefixtures("fake_disks_and_nics")
def test_filesystem_error_skips_only_that_mount(caplog: pytest.LogCaptureFixture) -> None:
    source = HostSource()
    with caplog.at_level(logging.WARNING):
        scrape(source)  # registering describes (one collect), then a scrape, then another
        _, families = scrape(source)
    size = families["node_filesystem_size_bytes"]
    assert [s.labels for s in size.samples] == [
        {"device": "/dev/sda1", "mountpoint": "/", "fstype": "ext4"}
    ]
    assert families["node_filesystem_avail_bytes"].samples[0].value == 600  # statvfs f_bavail
    assert families["node_filesystem_free_bytes"].samples[0].value == 700  # statvfs f_bfree
    secret = [r for r in caplog.records if "/secret" in r.getMessage()]
    assert len(secret) == 1


@pytest.mark.usefixtures("fake_disks_and_nics")
def test_pseudo_filesystems_only_when_configured() -> None:
    _, families = scrape(HostSource(include_fstypes={"tmpfs"}))
    mounts = {s.labels["mountpoint"] for s in families["node_filesystem_size_bytes"].samples}
    assert mounts == {"/", "/run"}  # not /proc, not the overlay


@pytest.mark.usefixtures("fake_disks_and_nics")
def test_extra_labels_on_every_series() -> None:
    _, families = scrape(HostSource(extra_labels={"Hostname": "node01"}))
    samples = [s for f in families.values() for s in f.samples]
    assert samples
    assert all(s.labels.get("Hostname") == "node01" for s in samples)
    with pytest.raises(ValueError, match="device"):
        HostSource(extra_labels={"device": "x"})
    with pytest.raises(ValueError, match="not a valid"):
        HostSource(extra_labels={"bad-name": "x"})


def test_failing_group_is_absent_others_present(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(pernic: bool = False) -> None:
        raise RuntimeError("no /proc/net/dev")

    monkeypatch.setattr(psutil, "net_io_counters", broken)
    with caplog.at_level(logging.WARNING):
        _, families = scrape(HostSource())
    assert "node_network_receive_bytes" not in families
    assert "node_memory_MemTotal_bytes" in families
    assert sum("network" in r.getMessage() for r in caplog.records) == 1


def test_host_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(psutil, "getloadavg", lambda: (4.0, 2.0, 1.0))
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8)
    assert host_load() == 0.5
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: None)
    assert host_load() == 4.0
    assert host.HostSource().fast_readings() == []


# ---------------------------------------------------------------------- LogWatcher
PATTERNS = {"cuda": "CUDA error", "nan": r"\bNaN\b"}


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Path, CounterState, list[LogWatcher]]]:
    """A log path, a state, and a list the test appends its watchers to (stopped at the end)."""
    watchers: list[LogWatcher] = []
    yield tmp_path / "train.log", CounterState(tmp_path / "state.json"), watchers
    for watcher in watchers:
        watcher.stop()


def start(watchers: list[LogWatcher], log: Path, state: CounterState) -> LogWatcher:
    watcher = LogWatcher(log, PATTERNS, state, poll_interval=0.02)
    watchers.append(watcher)
    watcher.start()
    return watcher


def count(watcher: LogWatcher, pattern: str) -> float:
    (family,) = watcher.collect()
    return next(s.value for s in family.samples if s.labels["pattern"] == pattern)


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_counts_new_lines_not_history(watched: Any) -> None:
    log, state, watchers = watched
    append(log, "CUDA error: old\nNaN old\nunfinished CUDA error")  # history, partial last line
    watcher = start(watchers, log, state)
    append(log, " then NaN\nCUDA error 1\nloss NaN\nCUDA error and NaN\nNaNa is not NaN-ish\n")
    wait_for(lambda: count(watcher, "cuda") == 2, "2 cuda lines")
    wait_for(lambda: count(watcher, "nan") == 3, "3 NaN lines")
    text, families = scrape(watcher)
    assert "# TYPE metricvault_log_matches_total counter" in text
    assert values(families["metricvault_log_matches"], pattern="cuda") == {
        (("path", str(log)), ("pattern", "cuda")): 2.0
    }


def test_partial_line_counted_once_complete(watched: Any) -> None:
    log, state, watchers = watched
    log.touch()
    watcher = start(watchers, log, state)
    append(log, "step 10 CUDA err")
    watcher.poll()  # synchronous: everything written so far has been read
    watcher.poll()
    assert count(watcher, "cuda") == 0
    append(log, "or: illegal address\n")
    wait_for(lambda: count(watcher, "cuda") == 1, "the completed line")


def test_rotation_loses_nothing(watched: Any) -> None:
    log, state, watchers = watched
    log.touch()
    watcher = start(watchers, log, state)
    writer = open(log, "a")  # noqa: SIM115 - a logger's handle, kept across the rename
    writer.write("CUDA error a\n" * 5)
    writer.flush()
    os.rename(log, log.with_suffix(".log.1"))
    writer.write("CUDA error b\n" * 2 + "CUDA error unterminated")  # the old handle, after rename
    writer.close()
    append(log, "CUDA error c\n" * 3)
    wait_for(lambda: count(watcher, "cuda") == 11, "11 lines across the rotation")
    os.rename(log, log.with_suffix(".log.2"))  # and again
    append(log, "CUDA error d\n")
    wait_for(lambda: count(watcher, "cuda") == 12, "a line after the second rotation")
    watcher.poll()
    assert count(watcher, "cuda") == 12


def test_truncation_restarts_from_zero(watched: Any) -> None:
    log, state, watchers = watched
    log.touch()
    watcher = start(watchers, log, state)
    append(log, "CUDA error 1\n" + "padding\n" * 100 + "CUDA error 2\n")
    wait_for(lambda: count(watcher, "cuda") == 2, "2 lines")
    log.write_text("CUDA error after truncate\n")
    wait_for(lambda: count(watcher, "cuda") == 3, "the line after truncation")


def test_file_created_after_start_is_read_from_its_start(watched: Any) -> None:
    log, state, watchers = watched
    watcher = start(watchers, log, state)
    watcher.poll()
    append(log, "CUDA error first\nNaN\n")
    wait_for(lambda: count(watcher, "cuda") == 1 and count(watcher, "nan") == 1, "both lines")


def test_restart_resumes_from_saved_offset(watched: Any, tmp_path: Path) -> None:
    log, state, watchers = watched
    append(log, "CUDA error history\n")
    watcher = start(watchers, log, state)
    append(log, "CUDA error 1\nCUDA error 2\n")
    wait_for(lambda: count(watcher, "cuda") == 2, "2 lines before the restart")
    watcher.stop()

    append(log, "CUDA error while stopped\n" * 3)
    doc = json.loads((tmp_path / "state.json").read_text())
    assert set(doc) == {"counters", "offsets"}
    read = len(b"CUDA error history\nCUDA error 1\nCUDA error 2\n")
    assert doc["offsets"][str(log)] == [os.stat(log).st_ino, read]

    restarted = CounterState(tmp_path / "state.json")  # a new process
    assert restarted.get(next(iter(doc["counters"]))) == 2
    again = start(watchers, log, restarted)
    wait_for(lambda: count(again, "cuda") == 5, "the 3 lines written while stopped")
    append(log, "CUDA error after restart\n")
    wait_for(lambda: count(again, "cuda") == 6, "a line after the restart")
    again.poll()
    assert count(again, "cuda") == 6  # each line exactly once


def test_restart_on_replaced_file_skips_its_history(watched: Any, tmp_path: Path) -> None:
    log, state, watchers = watched
    log.touch()
    start(watchers, log, state).stop()
    os.rename(log, tmp_path / "old.log")
    append(log, "CUDA error in a file never seen\n")  # another inode
    watcher = start(watchers, log, CounterState(tmp_path / "state.json"))
    append(log, "CUDA error new\n")
    wait_for(lambda: count(watcher, "cuda") == 1, "the new line")
    watcher.poll()
    assert count(watcher, "cuda") == 1


def test_invalid_patterns(tmp_path: Path) -> None:
    state = CounterState(tmp_path / "state.json")
    with pytest.raises(ValueError, match=r"'broken'.*invalid regular expression"):
        LogWatcher(tmp_path / "x.log", {"ok": "fine", "broken": "CUDA (error"}, state)
    with pytest.raises(ValueError, match="at least one"):
        LogWatcher(tmp_path / "x.log", {}, state)
    assert parse_patterns(["cuda=CUDA error", r"nan=\bNaN\b", "eq=a=b"]) == {
        "cuda": "CUDA error",
        "nan": r"\bNaN\b",
        "eq": "a=b",
    }
    with pytest.raises(ValueError, match="NAME=REGEX"):
        parse_patterns(["CUDA error"])
    with pytest.raises(ValueError, match="twice"):
        parse_patterns(["a=x", "a=y"])
    with pytest.raises(ValueError, match="'bad'"):
        parse_patterns(["bad=("])


# ---------------------------------------------------------------------- CounterState
def test_counter_state_persists_and_survives_corruption(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "sub" / "state.json"
    state = CounterState(path, save_interval=3600)
    state.add("push_dropped_samples", 5)
    state.add("push_dropped_samples")
    assert not path.exists()  # within save_interval: not written yet
    state.save()
    assert CounterState(path).get("push_dropped_samples") == 6
    assert not list(path.parent.glob("*.tmp"))
    with pytest.raises(ValueError, match="only increase"):
        state.add("x", -1)

    for garbage in ("{not json", '{"counters": {"a": "many"}}', "[]"):
        path.write_text(garbage)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            fresh = CounterState(path)
        assert fresh.counters() == {}
        assert len(caplog.records) == 1
