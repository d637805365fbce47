"""Issue 11: `metricvault prometheus-config` never breaks a prometheus.yml.

Run on a copy of Debian's own default /etc/prometheus/prometheus.yml (which already has
`scrape_configs`), checked by the real `promtool check config`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEBIAN_DEFAULT = Path("/etc/prometheus/prometheus.yml")

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None or not DEBIAN_DEFAULT.exists(),
    reason="needs Debian's prometheus package (promtool and /etc/prometheus/prometheus.yml)",
)


def metricvault(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def promtool_ok(path: Path) -> bool:
    done = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    return done.returncode == 0


@pytest.fixture
def prometheus_yml(tmp_path: Path) -> Path:
    copy = tmp_path / "prometheus.yml"
    shutil.copy(DEBIAN_DEFAULT, copy)
    assert promtool_ok(copy)
    return copy


def test_default_fragment_is_remote_write_only_and_appends_safely(prometheus_yml):
    done = metricvault("prometheus-config", cwd=prometheus_yml.parent)
    assert done.returncode == 0, done.stderr
    assert "scrape_configs" not in done.stdout and ":9400" not in done.stdout
    with prometheus_yml.open("a") as fh:  # README's old `>> prometheus.yml`, now harmless
        fh.write(done.stdout)
    assert promtool_ok(prometheus_yml)


def test_agent_adds_the_scrape_job(tmp_path):
    done = metricvault(
        "prometheus-config", "--agent", "10.0.0.7:9400", "--agent", "10.0.0.8:9400", cwd=tmp_path
    )
    assert "job_name: metricvault-agent" in done.stdout
    assert "['10.0.0.7:9400', '10.0.0.8:9400']" in done.stdout
    (tmp_path / "alone.yml").write_text(done.stdout)
    assert promtool_ok(tmp_path / "alone.yml")
    bad = metricvault("prometheus-config", "--agent", "10.0.0.7", cwd=tmp_path)
    assert bad.returncode == 2 and "must be HOST:PORT" in bad.stderr


def test_merge_edits_debians_default_safely_and_twice_is_a_no_op(prometheus_yml):
    original = prometheus_yml.read_text()
    args = ("prometheus-config", "--merge", str(prometheus_yml), "--agent", "127.0.0.1:9400")
    first = metricvault(*args, cwd=prometheus_yml.parent)
    assert first.returncode == 0, first.stderr
    assert promtool_ok(prometheus_yml)
    merged = prometheus_yml.read_text()
    assert "# Sample config for Prometheus." in merged  # comments survive
    assert "job_name: 'prometheus'" in merged and "job_name: metricvault-agent" in merged
    assert "url: http://127.0.0.1:9201/api/v1/write" in merged
    backups = list(prometheus_yml.parent.glob("prometheus.yml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == original

    second = metricvault(*args, cwd=prometheus_yml.parent)
    assert second.returncode == 0 and "unchanged" in second.stderr
    assert prometheus_yml.read_text() == merged
    assert len(list(prometheus_yml.parent.glob("prometheus.yml.bak-*"))) == 1

    more = metricvault(*args, "--agent", "127.0.0.1:9401", cwd=prometheus_yml.parent)
    assert more.returncode == 0, more.stderr
    assert promtool_ok(prometheus_yml)
    assert "127.0.0.1:9401" in prometheus_yml.read_text()
    assert prometheus_yml.read_text().count("job_name: metricvault-agent") == 1


def test_merge_refuses_a_file_it_cannot_parse(tmp_path):
    broken = tmp_path / "prometheus.yml"
    broken.write_text("scrape_configs:\n  - job_name: [unclosed\n")
    done = metricvault("prometheus-config", "--merge", str(broken), cwd=tmp_path)
    assert done.returncode == 2 and "not valid YAML, left unchanged" in done.stderr
    assert broken.read_text() == "scrape_configs:\n  - job_name: [unclosed\n"
    assert not list(tmp_path.glob("prometheus.yml.bak-*"))


def test_remote_read_fragment_and_merge_pass_promtool(prometheus_yml):
    """--remote-read adds the gateway's /api/v1/read; the fragment alone, appended to Debian's
    default and merged into it are all valid configurations, and merging twice adds it once."""
    done = metricvault("prometheus-config", "--remote-read", cwd=prometheus_yml.parent)
    assert done.returncode == 0, done.stderr
    assert "url: http://127.0.0.1:9201/api/v1/read" in done.stdout
    (prometheus_yml.parent / "alone.yml").write_text(done.stdout)
    assert promtool_ok(prometheus_yml.parent / "alone.yml")

    args = ("prometheus-config", "--merge", str(prometheus_yml), "--remote-read")
    for _ in range(2):
        merged = metricvault(*args, cwd=prometheus_yml.parent)
        assert merged.returncode == 0, merged.stderr
        assert promtool_ok(prometheus_yml)
    text = prometheus_yml.read_text()
    assert text.count("/api/v1/read") == 1 and text.count("/api/v1/write") == 1
    assert "unchanged" in merged.stderr


def test_remote_read_is_added_to_a_file_that_already_has_remote_write(prometheus_yml):
    first = metricvault(
        "prometheus-config", "--merge", str(prometheus_yml), cwd=prometheus_yml.parent
    )
    assert first.returncode == 0 and "remote_read" not in prometheus_yml.read_text()
    later = metricvault(
        "prometheus-config", "--merge", str(prometheus_yml), "--remote-read",
        cwd=prometheus_yml.parent,
    )  # fmt: skip
    assert later.returncode == 0 and "added remote_read from" in later.stderr, later.stderr
    assert promtool_ok(prometheus_yml)
