"""The settings schema: layering, validation, and documentation of every setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from metricvault.config import RetentionOverride, Settings, setting_names
from metricvault.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_setting_is_documented():
    text = DOCS.read_text()
    missing = [name for name in setting_names() if f"`{name}`" not in text]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"


def test_layers_defaults_file_env_flags(tmp_path):
    cfg = tmp_path / "mv.toml"
    cfg.write_text(
        'retention_raw = "7d"\nflush_interval = "5s"\n'
        '[[retention_overrides]]\nselector = \'{experiment="p"}\'\ntier = "raw"\n'
        'retention = "forever"\n'
    )
    env = {"METRICVAULT_FLUSH_INTERVAL": "2s", "METRICVAULT_CACHE_BYTES": "1_000"}
    s = Settings.load(cfg, env=env, data="/x")
    assert (s.retention_raw, s.flush_interval, s.cache_bytes, s.data) == ("7d", "2s", 1000, "/x")
    assert s.retention_overrides == (RetentionOverride('{experiment="p"}', "raw", "forever"),)
    assert Settings.load(env={}).retention_raw == "30d"


def test_nested_metricvault_table(tmp_path):
    cfg = tmp_path / "mv.toml"
    cfg.write_text('[metricvault]\nretention_1m = "365d"\n')
    assert Settings.load(cfg, env={}).retention_ms("1m") == 365 * 86_400_000


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('retention_raw = "soon"', "retention_raw"),
        ("flush_max_samples = 0", "at least 1"),
        ('no_such_setting = "x"', "unknown setting"),
        ("retention_raw = ", "not valid TOML"),
        (
            '[[retention_overrides]]\nselector="x"\ntier="5m"\nretention="1d"',
            "tiers are raw, 1m, 1h",
        ),
    ],
)
def test_bad_settings_are_refused(tmp_path, content, message):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=message):
        Settings.load(cfg, env={})


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.load("/nonexistent/metricvault.toml", env={})
