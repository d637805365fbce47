"""PromQL selector parsing (promql-parser's grammar) and matching (RE2, as Prometheus)."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricvault.errors import PromQLError, SelectorError
from metricvault.promql import Engine, EngineOptions, MemorySource
from metricvault.selector import (
    MAX_UNION,
    Matcher,
    Selector,
    SelectorUnion,
    parse_selector,
    parse_selectors,
    promql_quote,
    rewrite_strings,
)

SERIES = {
    "a": ("gpu_util", {"Hostname": "node01", "gpu": "0"}),
    "b": ("gpu_util", {"Hostname": "node02", "gpu": "1", "team": "x"}),
    "c": ("power", {"Hostname": "node01", "gpu": "0"}),
    "d": ("job:power:sum", {"job": "api", "path": "C:\\dir", "note": 'say "hi"\n'}),
}


def selected(text: str) -> set[str]:
    sel = parse_selectors(text)
    return {k for k, (m, labels) in SERIES.items() if sel.matches(m, labels)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu_util", {"a", "b"}),
        ('gpu_util{Hostname="node01"}', {"a"}),
        ('gpu_util{Hostname!="node01"}', {"b"}),
        ('gpu_util{Hostname=~"node0[12]"}', {"a", "b"}),
        ('gpu_util{Hostname=~"node0"}', set()),  # regexes are anchored
        ('gpu_util{Hostname=~"ode01"}', set()),
        ('gpu_util{Hostname!~"node01"}', {"b"}),
        ('{Hostname="node01"}', {"a", "c"}),
        ('{__name__=~"gpu_.*|power", gpu="0"}', {"a", "c"}),
        ('{__name__="power"}', {"c"}),
        ('{"power"}', {"c"}),  # Prometheus 3's quoted metric name
        ('gpu_util{team=""}', {"a"}),  # empty matches absent labels
        ("gpu_util{team!=''}", {"b"}),
        ('{team!=""}', {"b"}),  # Prometheus: a matcher that refuses "" is enough
        ('gpu_util{ Hostname = "node01" , gpu="0", }', {"a"}),
        ('gpu_util{Hostname="node\\"01"}', set()),
        ("job:power:sum", {"d"}),  # recording-rule names have colons
        ("gpu_util{Hostname=`node01`}", {"a"}),  # raw strings, as /api/v1/query takes them
        ("{path=`C:\\dir`}", {"d"}),  # no escapes in a raw string
        ("{path=~`C:\\\\d.r`}", {"d"}),  # the regex \\ is one backslash
        ('{path="C:\\\\dir"}', {"d"}),
        ('{note="say \\"hi\\"\\n"}', {"d"}),
        ('{note=~"say.*\\n"}', {"d"}),
        ('{note=~"say.*"}', {"d"}),  # "." matches a newline, as Prometheus 3's (?s:...)
        ('{job="\\x61\\u0070\\151"}', {"d"}),  # every Go escape: hex, unicode, octal
        ('{Hostname="node01"} or gpu_util', {"a", "b", "c"}),
        ('{job="api"} or power or gpu_util{gpu="1"}', {"b", "c", "d"}),
        ('gpu_util{gpu="0"}or{job="api"}', {"a", "d"}),
        ('gpu_util{gpu="0"} OR\n  power', {"a", "c"}),
        ('gpu_util{gpu="0", # the first GPU\n}', {"a"}),  # PromQL comments
        ('gpu_util{Hostname=~"(?i)NODE01"}', {"a"}),
        ('gpu_util{Hostname=~"node01|"}', {"a"}),
        ('gpu_util{Hostname=~"node0\\\\d"}', {"a", "b"}),
    ],
)
def test_selector_matching(text, expected):
    assert selected(text) == expected


@pytest.mark.parametrize(
    ("text", "matchers"),
    [  # what the hand-written parser accepted keeps its meaning
        ("gpu_util", [("__name__", "=", "gpu_util")]),
        ("  gpu_util  ", [("__name__", "=", "gpu_util")]),
        ("gpu_util{}", [("__name__", "=", "gpu_util")]),
        ("gpu_util{a='x'}", [("__name__", "=", "gpu_util"), ("a", "=", "x")]),
        ("gpu_util{a='it\\'s'}", [("__name__", "=", "gpu_util"), ("a", "=", "it's")]),
        ("gpu_util{a='say \\\"hi\\\"'}", [("__name__", "=", "gpu_util"), ("a", "=", 'say "hi"')]),
        ('gpu_util{a="x",}', [("__name__", "=", "gpu_util"), ("a", "=", "x")]),
        (
            'gpu_util {a = "x" ,b!~ "y"}',
            [("__name__", "=", "gpu_util"), ("a", "=", "x"), ("b", "!~", "y")],
        ),
        ('{a="x\\ty\\\\z\\/w"}', [("a", "=", "x\ty\\z/w")]),  # JSON's \/ too
        ('{a="\\u00e9\\ud83d\\ude00"}', [("a", "=", "é😀")]),  # json.dumps' surrogate pairs
        ('{a="é😀"}', [("a", "=", "é😀")]),
        ('{__name__=~"a|b", c="d"}', [("__name__", "=~", "a|b"), ("c", "=", "d")]),
    ],
)
def test_old_selector_forms_keep_their_meaning(text, matchers):
    assert parse_selector(text) == Selector(tuple(Matcher(*m) for m in matchers))


def test_or_joins_selectors_into_a_union():
    union = parse_selectors('{job="r1"} or gpu_util{Hostname=~"node0[12]"}')
    assert union == SelectorUnion(
        (
            Selector((Matcher("job", "=", "r1"),)),
            Selector(
                (Matcher("__name__", "=", "gpu_util"), Matcher("Hostname", "=~", "node0[12]"))
            ),
        )
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty selector"),
        ("   ", "empty selector"),
        ("gpu_util{", "cannot parse selector 'gpu_util{' at char 9 \\(the end\\)"),
        ('gpu_util{a="x" b="y"}', "at char 15 .*expected ',' between matchers"),
        ("gpu_util{a=x}", "at char 11 .*unexpected identifier 'x'"),
        ('gpu_util{a="x"}}', "at char 15"),
        ('gpu_util{a="x', "at char 11 .*unterminated quoted string"),
        ('gpu_util{a="\\z"}', "at char 11 .*unknown escape sequence 'z'"),
        ("gpu util", "at char 4 \\(near 'util'\\)"),
        ('{a=~".*"}', "matches every series .*at least one non-empty matcher"),
        ('{a!="x"}', "matches every series"),
        ('{a=""} or gpu_util', "matches every series"),
        ('gpu_util{__name__="x"}', "metric name must not be set twice"),
        ('{job="r1"} or gpu_util', "one series selector is expected here, not 2"),
        ('up{a="x" or b="y"}', "'or' between matchers inside braces is not supported"),
    ],
)
def test_bad_selectors_are_refused(text, message):
    with pytest.raises(SelectorError, match=message):
        parse_selector(text)


@pytest.mark.parametrize(
    "text",
    [
        "rate(x[5m])",
        "a + b",
        "x[5m]",
        "x offset 5m",
        "x @ 100",
        "(x)",
        "sum(x)",
        "1",
        '"x"',
        "a or on(job) b",
        "a and b",
        "-x",
    ],
)
def test_promql_that_is_not_a_selector_is_refused(text):
    with pytest.raises(SelectorError, match="a series selector was expected"):
        parse_selectors(text)


@pytest.mark.parametrize(
    ("regex", "words"),
    [  # Go's regexp (so Prometheus) words for what RE2 refuses
        ("(?=x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"),
        ("(?!x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?!`"),
        ("(?<=x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?<=`"),
        ("(a)\\1", "error parsing regexp: invalid escape sequence: `\\1`"),
        ("(", "error parsing regexp: missing closing ): `^(?s:()$`"),
        (")", "error parsing regexp: unexpected ): `^(?s:))$`"),
        ("[a", "error parsing regexp: missing closing ]: `[a)$`"),
        ("[z-a]", "error parsing regexp: invalid character class range: `z-a`"),
        ("*a", "error parsing regexp: missing argument to repetition operator: `*`"),
        ("a**", "error parsing regexp: invalid nested repetition operator: `**`"),
        ("x++", "error parsing regexp: invalid nested repetition operator: `++`"),
        ("x{1001}", "error parsing regexp: invalid repeat count: `{1001}`"),
    ],
)
def test_regexes_re2_refuses_are_refused_in_prometheus_words(regex, words):
    with pytest.raises(SelectorError) as matcher:
        Matcher("a", "=~", regex)
    assert str(matcher.value).endswith(words)
    text = f"up{{a=~{promql_quote(regex)}}}"
    with pytest.raises(SelectorError) as parsed:
        parse_selector(text)
    assert words in str(parsed.value)
    assert f"cannot parse selector {text!r} at char 6" in str(parsed.value)


def test_a_catastrophic_regex_answers_at_once():
    # Python's backtracking re takes ~2**n steps on these (and holds the GIL, so a thread
    # cannot time it out): a subprocess with a timeout fails the test instead of hanging it.
    script = textwrap.dedent(
        """
        from metricvault.selector import Matcher, parse_selector
        for regex in ("(a+)+b", "(.|.|.)+Z", "(a|aa)+c", "(x+x+)+y"):
            for n in (28, 40, 10_000):
                value = "a" * n if "a" in regex else "x" * n
                assert not Matcher("y", "=~", regex).matches(value)
                assert Matcher("y", "!~", regex).matches(value)
        sel = parse_selector('up{y=~"B-T((.|.|.)+)+Z"}')
        assert not sel.matches("up", {"y": "B-T" + "x" * 10_000})
        print("answered")
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a catastrophic regex did not answer: matchers backtrack again")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "answered"


@pytest.mark.parametrize(
    ("regex", "value", "hit"),
    [
        ("a|b", "ab", False),
        ("a|b", "b", True),
        ("a|b|", "", True),
        ("node-1|node 2", "node 2", True),
        ("x.y", "x\ny", True),  # (?s): "." matches a newline
        ("x$", "x\n", False),  # "$" is the very end
        (".*", "anything\n", True),
        (".+", "", False),
        ("é.", "éü", True),  # "." is one code point
        ("\\d+", "123", True),
        ("\\d+", "١٢٣", False),  # RE2's \d is ASCII, as Go's
        ("[[:alpha:]]+", "abc", True),
        ("\\Q.*\\E", ".*", True),
        ("\\Q.*\\E", "ab", False),
    ],
)
def test_matchers_anchor_and_match_as_prometheus(regex, value, hit):
    assert Matcher("l", "=~", regex).matches(value) is hit
    assert Matcher("l", "!~", regex).matches(value) is not hit


def test_a_matcher_remembers_no_more_than_its_memo_holds():
    m = Matcher("l", "=~", "n[0-9]+")
    assert all(m.matches(f"n{i}") for i in range(10_000))
    assert not m.matches("nx")


def test_matchers_pickle_and_compare_by_their_fields():
    m = Matcher("l", "=~", "n[0-9]+")
    copy = pickle.loads(pickle.dumps(m))
    assert copy == m and hash(copy) == hash(m)
    assert copy.matches("n12") and not copy.matches("n")


def test_unknown_matcher_operators_are_refused():
    with pytest.raises(SelectorError, match="unknown matcher operator '=='"):
        Matcher("l", "==", "x")


values = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


@given(value=values, op=st.sampled_from(["=", "!="]))
def test_matcher_text_parses_back_to_the_same_matcher(value, op):
    matcher = Matcher("label", op, value)
    selector = Selector((Matcher("__name__", "=", "m"), matcher))
    assert parse_selector(str(selector)) == selector


@pytest.mark.parametrize(
    "value",
    ['"', "\\", "\n", "`", "'", 'a\\"b', "\x00\x7f\x85", "\u2028", "😀", "\\d+\\.`x`", "\t\r"],
)
def test_awkward_values_round_trip(value):
    for op in ("=", "!="):
        matcher = Matcher("l", op, value)
        assert parse_selector(f"up{{{matcher}}}").matchers[1] == matcher


@pytest.mark.parametrize("regex", ["\\d+\\.\\d+", "a\\\\b", '"q"', "`x`", "\\n|\\t", "é|😀"])
def test_regex_matchers_round_trip(regex):
    matcher = Matcher("l", "=~", regex)
    assert parse_selector(f"up{{{matcher}}}").matchers[1] == matcher


def test_label_names_outside_the_classic_pattern_are_quoted():
    matcher = Matcher("service.name", "=", "api")
    assert str(matcher) == '"service.name"="api"'
    assert parse_selector(f"up{{{matcher}}}").matchers[1] == matcher


@pytest.mark.parametrize(
    ("expr", "spelled"),
    [
        ("up", "up"),
        ("up{a=`x\\d`}", 'up{a="x\\\\d"}'),
        ('up{a=`"`}', 'up{a="\\""}'),
        ('up{a="\\/"}', 'up{a="/"}'),
        ('up{a="\\\\/"}', 'up{a="\\\\/"}'),  # an escaped backslash, then a slash
        ("up{a='\\\"'}", "up{a='\"'}"),
        ('up{a="\\ud83d\\ude00"}', 'up{a="\\U0001f600"}'),
        ("up # a `comment`\n", "up # a `comment`\n"),
        ("sum(rate(x{a=`\\w`}[5m])) by (a)", 'sum(rate(x{a="\\\\w"}[5m])) by (a)'),
    ],
)
def test_strings_are_respelled_as_the_parser_reads_them(expr, spelled):
    assert rewrite_strings(expr) == spelled


def _engine_selects(text: str) -> set[str]:
    source = MemorySource()
    for key, (metric, labels) in SERIES.items():
        source.add({"__name__": metric, **labels, "key": key}, [0], [1.0])
    result = Engine(source, EngineOptions()).evaluate(text, 0)
    return {labels["key"] for labels, _, _ in result.series}


@pytest.mark.parametrize(
    "text",
    [
        "{path=`C:\\dir`}",
        "{path=~`C:\\\\d.r`}",
        '{job="\\x61\\u0070\\151"}',
        '{Hostname="node01"} or gpu_util',
        '{note=~"say.*"}',
        'gpu_util{Hostname=~"node0[12]", gpu!="1"}',
    ],
)
def test_the_engine_and_parse_selectors_select_the_same_series(text):
    assert _engine_selects(text) == selected(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('up{a=~"a**"}', "error parsing regexp: invalid nested repetition operator: `**`"),
        ('up{a=~"(?=x)"}', "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"),
        ('up{a=~"("}', "illegal regex for (: error parsing regexp: missing closing ): `^(?s:()$`"),
        ('up{a="x" or b="y"}', "'or' between label matchers is not supported"),
    ],
)
def test_the_engine_refuses_what_parse_selectors_refuses(text, words):
    with pytest.raises(SelectorError):
        parse_selectors(text)
    with pytest.raises(PromQLError, match=re.escape(words)) as info:
        _engine_selects(text)
    assert info.value.kind == "bad_data"


def test_a_union_of_many_selectors_is_parsed_up_to_the_limit():
    union = parse_selectors(" or ".join(f'up{{i="{i}"}}' for i in range(MAX_UNION)))
    assert len(union.parts) == MAX_UNION


@pytest.mark.parametrize(
    "text",
    [" or ".join(["up"] * (MAX_UNION + 1)), " or ".join(["up"] * 20_000), "(" * 20_000 + "up"],
)
def test_selectors_too_long_for_the_parser_are_refused_before_it_runs(text):
    # promql-parser overflows its stack (killing the process) near a few thousand operators
    with pytest.raises(SelectorError, match=f"at most {MAX_UNION} selectors"):
        parse_selectors(text)
