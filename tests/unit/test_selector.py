"""PromQL selector parsing and matching."""

from __future__ import annotations

import pytest

from metricvault.errors import SelectorError
from metricvault.selector import parse_selector

SERIES = {
    "a": ("gpu_util", {"Hostname": "node01", "gpu": "0"}),
    "b": ("gpu_util", {"Hostname": "node02", "gpu": "1", "team": "x"}),
    "c": ("power", {"Hostname": "node01", "gpu": "0"}),
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu_util", {"a", "b"}),
        ('gpu_util{Hostname="node01"}', {"a"}),
        ('gpu_util{Hostname!="node01"}', {"b"}),
        ('gpu_util{Hostname=~"node0[12]"}', {"a", "b"}),
        ('gpu_util{Hostname=~"node0"}', set()),  # regexes are anchored
        ('gpu_util{Hostname!~"node01"}', {"b"}),
        ('{Hostname="node01"}', {"a", "c"}),
        ('{__name__=~"gpu_.*|power", gpu="0"}', {"a", "c"}),
        ('gpu_util{team=""}', {"a"}),  # empty matches absent labels
        ("gpu_util{team!=''}", {"b"}),
        ('gpu_util{ Hostname = "node01" , gpu="0", }', {"a"}),
        ('gpu_util{Hostname="node\\"01"}', set()),
    ],
)
def test_selector_matching(text, expected):
    sel = parse_selector(text)
    assert {k for k, (m, labels) in SERIES.items() if sel.matches(m, labels)} == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty selector"),
        ("gpu_util{", "cannot parse"),
        ('gpu_util{a="x" b="y"}', "expected ','"),
        ('gpu_util{a=~"("}', "invalid regular expression"),
        ('{a=~".*"}', "matches every series"),
        ('{a!="x"}', "matches every series"),
        ("gpu util", "cannot parse"),
    ],
)
def test_bad_selectors_are_refused(text, message):
    with pytest.raises(SelectorError, match=message):
        parse_selector(text)
