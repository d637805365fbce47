"""Labels, canonical series, series ids and collision detection."""

from __future__ import annotations

import pytest

from metricvault import model
from metricvault.durations import parse_duration_ms
from metricvault.errors import LabelError, SeriesCollisionError
from metricvault.model import Series, kind_from_name, series_id_of
from metricvault.store.series_index import SeriesIndex


@pytest.mark.parametrize(
    ("labels_a", "labels_b"),
    [
        ({"a": "1", "b": "2"}, {"b": "2", "a": "1"}),
        ({"a": "1", "empty": ""}, {"a": "1"}),
        ({"a": "1", "none": None}, {"a": "1"}),
    ],
)
def test_canonical_form_ignores_order_and_empty_labels(labels_a, labels_b):
    assert Series.make("m", labels_a) == Series.make("m", labels_b)
    assert Series.make("m", labels_a).series_id == Series.make("m", labels_b).series_id


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("m", {"a": "1"}), ("m", {"a": "2"})),
        (("m", {"a": "1"}), ("n", {"a": "1"})),
        (("m", {"a": "1,b=2"}), ("m", {"a": "1", "b": "2"})),
        (("m", {"a": 'x"'}), ("m", {"a": "x"})),
    ],
)
def test_different_series_have_different_ids(one, other):
    assert Series.make(*one).series_id != Series.make(*other).series_id


def test_canonical_string_is_prometheus_like_and_escaped():
    s = Series.make("up", {"job": 'a"b', "instance": "x"})
    assert s.canonical == 'up{instance="x",job="a\\"b"}'
    assert s.series_id == series_id_of(s.canonical)


@pytest.mark.parametrize(
    ("metric", "labels", "message"),
    [
        ("", {}, "invalid metric name"),
        ("1abc", {}, "invalid metric name"),
        ("gpu-util", {}, "invalid metric name"),
        ("m", {"bad-name": "x"}, "invalid label name"),
        ("m", {"__name__": "x"}, "invalid label name"),
        ("m", {"timestamp": "x"}, "reserved"),
        ("m", {"a": 5}, "must be strings"),
        ("m", {"a": "x\x00y"}, r"control character U\+0000 at position 1"),
        ("m", {"a": "\x1e"}, r"control character U\+001E"),
        ("m", {"a": "x\x7f"}, r"control character U\+007F"),
        ("m", {"a": "x\x85"}, r"control character U\+0085"),
        ("m", {"a": "x" * 5000}, "limit is 4096 bytes"),
        ("m", {f"l{i}": "v" for i in range(70)}, "the limit is 64"),
    ],
)
def test_bad_names_and_values_are_refused_with_a_reason(metric, labels, message):
    with pytest.raises(LabelError, match=message):
        Series.make(metric, labels)


@pytest.mark.parametrize(
    ("metric", "kind"),
    [
        ("http_requests_total", "counter"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
        ("latency_seconds_bucket", "counter"),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
        ("mfu", "gauge"),
    ],
)
def test_kind_from_name(metric, kind):
    assert kind_from_name(metric) == kind


def test_series_index_detects_collisions():
    index = SeriesIndex()
    assert index.add(42, "m", '{"a": "1"}', "gauge") is True
    assert index.add(42, "m", '{"a": "1"}', "gauge") is False
    with pytest.raises(SeriesCollisionError, match="hashes to the same 64-bit id"):
        index.add(42, "m", '{"a": "2"}', "gauge")
    assert index.get(42).labels == {"a": "1"}


@pytest.mark.parametrize("value", ["tab\there", "two\nlines", "cr\r", "ünïcödé ✓", "\u2028"])
def test_label_values_may_hold_tab_newline_and_any_printable_unicode(value):
    assert Series.make("m", {"a": value}).label_dict() == {"a": value}


def test_control_character_error_names_the_series_and_the_label():
    with pytest.raises(LabelError) as refused:
        Series.make("gpu_util", {"gpu": "0", "mig": "\x00\x1e"})
    message = str(refused.value)
    assert 'gpu_util{gpu="0",mig="\\u0000\\u001e"}' in message
    assert "label 'mig'" in message


def test_tier_resolutions_are_the_tier_names_read_as_durations():
    # One table, model.TIER_RESOLUTION_MS: the query layer and the rollups read it.
    assert set(model.TIER_RESOLUTION_MS) == set(model.TIERS) - {"raw"}
    for tier, width_ms in model.TIER_RESOLUTION_MS.items():
        assert width_ms == parse_duration_ms(tier)
    widths = list(model.TIER_RESOLUTION_MS.values())
    assert widths == sorted(widths, reverse=True)  # coarsest first, the order tiers are tried


def test_arrow_schemas_are_built_on_first_use_and_stay_one_object():
    assert model.SAMPLE_SCHEMA.names == ["series_id", "ts", "value"]
    assert model.SERIES_SCHEMA.names == ["series_id", "metric", "labels", "kind"]
    assert model.SAMPLE_SCHEMA is model.SAMPLE_SCHEMA
    with pytest.raises(AttributeError, match="NO_SUCH_SCHEMA"):
        _ = model.NO_SUCH_SCHEMA
