"""InfluxDB line protocol decoder: golden lines, precisions, gzip, rejections, bad input, fuzz."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricvault.errors import (
    InputError,
    LabelError,
    MetricVaultError,
    TooLargeError,
    UnsupportedError,
    ValueRangeError,
)
from metricvault.ingest.protocols import influx_line
from metricvault.ingest.protocols.influx_line import DecodedLines, LineError, decode_line_protocol

T_MS = 1_700_000_000_000
T_NS = f"{T_MS}000000"
NOW = 1_800_000_000_000

Row = tuple[str, int, float, dict[str, str]]


def decode(body: bytes | str, **kwargs: Any) -> DecodedLines:
    if isinstance(body, str):
        body = body.encode()
    kwargs.setdefault("now_ms", NOW)
    return decode_line_protocol(body, **kwargs)


def rows(result: DecodedLines) -> list[Row]:
    out = []
    for row in result.table.to_pylist():
        metric, ts, value = row.pop("metric"), row.pop("timestamp"), row.pop("value")
        out.append((metric, ts, value, {k: v for k, v in row.items() if v is not None}))
    return out


# --- golden lines: every type, escape and naming rule ------------------------------------------

NO_LABELS: dict[str, str] = {}  # typed, so mypy knows what the comprehension below builds

GOLDEN: list[tuple[str, str, list[Row]]] = [
    (
        "float forms",
        f"m a=1.5,b=1e3,c=-0.5,d=1E-2,e=.5,f=5.,g=-1.5e+3,h=0,i=42 {T_NS}",
        [
            ("m_a", T_MS, 1.5, {}),
            ("m_b", T_MS, 1000.0, {}),
            ("m_c", T_MS, -0.5, {}),
            ("m_d", T_MS, 0.01, {}),
            ("m_e", T_MS, 0.5, {}),
            ("m_f", T_MS, 5.0, {}),
            ("m_g", T_MS, -1500.0, {}),
            ("m_h", T_MS, 0.0, {}),
            ("m_i", T_MS, 42.0, {}),
        ],
    ),
    (
        "integers and unsigned",
        f"m a=12i,b=-3i,c=9223372036854775807i,d=-9223372036854775808i,e=0u,f=18446744073709551615u"
        f" {T_NS}",
        [
            ("m_a", T_MS, 12.0, {}),
            ("m_b", T_MS, -3.0, {}),
            ("m_c", T_MS, 9.223372036854776e18, {}),
            ("m_d", T_MS, -9.223372036854776e18, {}),
            ("m_e", T_MS, 0.0, {}),
            ("m_f", T_MS, 1.8446744073709552e19, {}),
        ],
    ),
    (
        "booleans",
        f"m a=t,b=T,c=true,d=True,e=TRUE,f=f,g=F,h=false,i=False,j=FALSE {T_NS}",
        [(f"m_{k}", T_MS, float(k < "f"), NO_LABELS) for k in "abcdefghij"],
    ),
    (
        "tags become labels, sorted columns",
        f"cpu,zone=z1,host=a,region=us usage=1 {T_NS}",
        [("cpu_usage", T_MS, 1.0, {"host": "a", "region": "us", "zone": "z1"})],
    ),
    (
        "measurement escapes comma and space; '=' is literal there",
        f"my\\ cpu\\,x,t=v f=1 {T_NS}\na=b f=2 {T_NS}",
        [("my_cpu_x_f", T_MS, 1.0, {"t": "v"}), ("a_b_f", T_MS, 2.0, {})],
    ),
    (
        "tag value escapes",
        f"m,a=x\\,y\\ z\\=w,b=C:\\\\,c=back\\slash,d=a\\\\\\,b f=1 {T_NS}",
        [("m_f", T_MS, 1.0, {"a": "x,y z=w", "b": "C:\\", "c": "back\\slash", "d": "a\\,b"})],
    ),
    (
        "tag key escapes",
        f"m,a\\ b=1,c\\=d=2,e\\,f=3 f=1 {T_NS}",
        [("m_f", T_MS, 1.0, {"a_b": "1", "c_d": "2", "e_f": "3"})],
    ),
    (
        "field key escapes",
        f"m my\\ field=1,x\\=y=2,p\\,q=3 {T_NS}",
        [("m_my_field", T_MS, 1.0, {}), ("m_x_y", T_MS, 2.0, {}), ("m_p_q", T_MS, 3.0, {})],
    ),
    (
        "names mapped to Prometheus' alphabet, values kept",
        f"disk.io,gpu-id=0,0x=1,a:b=2,ville=Zürich read-bytes=10 {T_NS}\n"
        f"température c=1 {T_NS}\n1m,t=v f:g=2 {T_NS}",
        [
            (
                "disk_io_read_bytes",
                T_MS,
                10.0,
                {"gpu_id": "0", "_0x": "1", "a_b": "2", "ville": "Zürich"},
            ),
            ("temp_rature_c", T_MS, 1.0, {}),
            ("_1m_f:g", T_MS, 2.0, {"t": "v"}),
        ],
    ),
    (
        "comments, blank lines, CRLF, surrounding and repeated blanks",
        f"# header\r\n\r\n   \n  # indented comment\nm f=1 {T_NS}\r\n  m  f=2   {T_NS}  \r\n"
        f"\tm f=3\t\n",
        [("m_f", T_MS, 1.0, {}), ("m_f", T_MS, 2.0, {}), ("m_f", NOW, 3.0, {})],
    ),
    (
        "missing timestamp means now",
        "m f=1",
        [("m_f", NOW, 1.0, {})],
    ),
    (
        "points lack tags others have",
        f"m,a=1 f=1 {T_NS}\nm,b=2 f=2,g=3i {T_NS}",
        [
            ("m_f", T_MS, 1.0, {"a": "1"}),
            ("m_f", T_MS, 2.0, {"b": "2"}),
            ("m_g", T_MS, 3.0, {"b": "2"}),
        ],
    ),
    (
        "no trailing newline, timestamps floored to ms",
        f"m f=1 {T_MS}999999",
        [("m_f", T_MS, 1.0, {})],
    ),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in GOLDEN], ids=[c[0] for c in GOLDEN])
def test_golden_lines(body: str, expected: list[Row]) -> None:
    result = decode(body)
    assert rows(result) == expected
    assert result.samples == len(expected) == result.table.num_rows
    assert result.rejected == ()


def test_table_schema_is_the_long_shape() -> None:
    result = decode(f"m,zone=z,Host=h,a=1 f=1,g=2i {T_NS}\nm,b=2 f=3 {T_NS}")
    assert result.table.schema == pa.schema(
        [
            pa.field("metric", pa.string(), nullable=False),
            pa.field("timestamp", pa.int64(), nullable=False),
            pa.field("value", pa.float64(), nullable=False),
            pa.field("Host", pa.string()),
            pa.field("a", pa.string()),
            pa.field("b", pa.string()),
            pa.field("zone", pa.string()),
        ]
    )
    assert result.table.column("b").to_pylist() == [None, None, "2"]
    assert (result.points, result.samples) == (2, 3)


def test_empty_body_gives_an_empty_table() -> None:
    result = decode(b"\n# only a comment\n\n")
    assert (result.points, result.samples, result.rejected) == (0, 0, ())
    assert result.table.column_names == ["metric", "timestamp", "value"]


def test_now_defaults_to_the_wall_clock() -> None:
    import time

    before = time.time_ns() // 1_000_000
    result = decode_line_protocol(b"m f=1")
    assert before <= result.table.column("timestamp")[0].as_py() <= time.time_ns() // 1_000_000


# --- precision --------------------------------------------------------------------------------

PRECISIONS = [
    ("ns", "1700000000123456789", 1_700_000_000_123),
    ("n", "1700000000123456789", 1_700_000_000_123),
    ("us", "1700000000123456", 1_700_000_000_123),
    ("u", "1700000000123999", 1_700_000_000_123),
    ("ms", "1700000000123", 1_700_000_000_123),
    ("s", "1700000000", 1_700_000_000_000),
    ("m", "28333333", 1_699_999_980_000),
    ("h", "472222", 1_699_999_200_000),
]


@pytest.mark.parametrize(("precision", "token", "expected_ms"), PRECISIONS)
def test_precision_converts_to_epoch_ms_by_floor(
    precision: str, token: str, expected_ms: int
) -> None:
    result = decode(f"m f=1 {token}", precision=precision)
    assert result.table.column("timestamp").to_pylist() == [expected_ms]


def test_unknown_precision_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown precision 'sec'"):
        decode("m f=1", precision="sec")


def test_timestamp_overflowing_int64_nanoseconds() -> None:
    with pytest.raises(ValueRangeError, match="outside the int64 nanosecond range"):
        decode("m f=1 9223372036854776", precision="s")


def test_timestamp_in_the_wrong_precision_gets_a_hint() -> None:
    with pytest.raises(ValueRangeError, match="looks like s — send precision=s"):
        decode("m f=1 1700000000")
    with pytest.raises(ValueRangeError, match="looks like ms — send precision=ms"):
        decode("m f=1 1700000000000", precision="ns")


# --- content encoding -------------------------------------------------------------------------

BODY = f"m,t=a f=1 {T_NS}\nm,t=b f=2 {T_NS}\n".encode()


@pytest.mark.parametrize("encoding", ["gzip", "GZIP", " gzip ", "x-gzip"])
def test_gzip_bodies(encoding: str) -> None:
    result = decode(gzip.compress(BODY), content_encoding=encoding)
    assert rows(result) == rows(decode(BODY))


@pytest.mark.parametrize("encoding", [None, "", "identity", "Identity"])
def test_identity_bodies(encoding: str | None) -> None:
    assert decode(BODY, content_encoding=encoding).samples == 2


def test_gzip_with_several_members() -> None:
    body = gzip.compress(BODY[:20]) + gzip.compress(BODY[20:])
    assert rows(decode(body, content_encoding="gzip")) == rows(decode(BODY))


def test_gzip_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"m f=1\n" * (16 * 1024**2 // 6))  # 16 MiB inflated, ~16 KiB sent
    assert len(bomb) < 100_000
    with pytest.raises(TooLargeError, match=r"inflates to more.* 1048576 bytes"):
        decode(bomb, content_encoding="gzip", max_decoded_bytes=1024**2)


def test_gzip_exactly_at_the_limit_is_fine() -> None:
    assert decode(gzip.compress(BODY), content_encoding="gzip", max_decoded_bytes=len(BODY)).points


def test_plain_body_over_the_limit() -> None:
    with pytest.raises(TooLargeError, match=f"the body is {len(BODY)} bytes"):
        decode(BODY, max_decoded_bytes=len(BODY) - 1)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (gzip.compress(BODY)[:-6], "ends early"),
        (b"not gzip at all", "not valid gzip"),
        (gzip.compress(BODY) + b"garbage!", "not valid gzip"),
        (b"", "ends early"),
        (zlib.compress(BODY), "not valid gzip"),
    ],
    ids=["truncated", "plain text", "trailing garbage", "empty", "zlib not gzip"],
)
def test_broken_gzip_is_an_input_error(body: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decode(body, content_encoding="gzip")


@pytest.mark.parametrize("encoding", ["br", "deflate", "zstd", "gzip, identity", "snappy"])
def test_other_encodings_are_unsupported(encoding: str) -> None:
    with pytest.raises(UnsupportedError, match="not supported") as info:
        decode(gzip.compress(BODY), content_encoding=encoding)
    assert info.value.status == 415


# --- string fields: rejected per line ---------------------------------------------------------


def test_string_field_rejects_its_line_only() -> None:
    body = (
        f"m f=1 {T_NS}\n"
        f'm,host=a msg="hello, \\"world\\" \\\\ x=1",f=2 {T_NS}\n'
        f"m f=3 {T_NS}\n"
        f'm a="",b="x" {T_NS}\n'
    )
    result = decode(body)
    assert [r[2] for r in rows(result)] == [1.0, 3.0]
    assert (result.points, result.samples) == (2, 2)
    assert result.rejected == (
        LineError(
            2,
            'm,host=a msg="hello, \\"world\\" \\\\ x=1",f=2 ' + T_NS,
            "string field 'msg' not stored: metricvault keeps numbers; send it as a tag or a log "
            "(the line's other fields were left out with it)",
        ),
        LineError(
            4,
            f'm a="",b="x" {T_NS}',
            "string fields 'a', 'b' not stored: metricvault keeps numbers; send them as a tag or "
            "a log (the line's other fields were left out with it)",
        ),
    )


def test_rejected_line_text_is_truncated() -> None:
    line = f'm msg="{"x" * 500}" {T_NS}'
    result = decode(f"m f=1\n{line}")
    assert result.rejected[0].text == line[:199] + "…"
    assert len(result.rejected[0].text) == 200


def test_every_line_rejected_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"all 2 lines were rejected.*line 1: string field 'a'"):
        decode('m a="x"\nm b="y"')


def test_a_syntax_error_beats_string_rejections() -> None:
    with pytest.raises(InputError, match="line 3"):
        decode('m a="x"\nm f=1\nm f=')


# --- limits -----------------------------------------------------------------------------------


def test_max_lines_counts_points_not_comments() -> None:
    body = "# c\nm f=1\n\nm f=2\n# c\nm f=3\n"
    assert decode(body, max_lines=3).points == 3
    with pytest.raises(TooLargeError, match="3 lines of line protocol, more than the limit of 2"):
        decode(body, max_lines=2)


def test_long_tag_value_is_refused() -> None:
    with pytest.raises(LabelError, match="5000-byte value; the limit is 4096"):
        decode(f"m,t={'v' * 5000} f=1")
    assert decode(f"m,t={'v' * 4096} f=1").points == 1


def test_too_many_tags() -> None:
    tags = ",".join(f"t{i}=v" for i in range(65))
    with pytest.raises(LabelError, match="65 tags; the limit is 64"):
        decode(f"m,{tags} f=1")


# --- bad input: the whole request fails, naming the line ---------------------------------------

BAD: list[tuple[str, bytes, type[MetricVaultError], str]] = [
    ("no fields", b"cpu", InputError, "line 1: measurement 'cpu' has no fields"),
    ("tags but no fields", b"cpu,host=a", InputError, "has no fields"),
    ("no measurement", b",host=a f=1", InputError, "does not start with a measurement"),
    ("only a field", b" =1", InputError, "measurement '=1' has no fields"),
    ("field without value", b"cpu f", InputError, "field 'f' has no '=value'"),
    ("field empty value", b"cpu f=", InputError, "field 'f' has no value"),
    ("trailing comma", b"cpu f=1,", InputError, "empty field"),
    ("empty field key", b"cpu =1", InputError, "empty key"),
    ("tag without value", b"cpu,host f=1", InputError, "tag 'host' has no '=value'"),
    ("tag empty value", b"cpu,host= f=1", InputError, "tag 'host' has an empty value"),
    ("tag empty key", b"cpu,=a f=1", InputError, "empty key"),
    ("stray comma in tags", b"cpu,,a=1 f=1", InputError, "empty tag"),
    ("unescaped = in tag", b"cpu,a=b=c f=1", InputError, "unescaped '='"),
    ("unterminated string", b'cpu f="abc', InputError, "has no closing '\"'"),
    ("escaped closing quote", b'cpu f="abc\\"', InputError, "has no closing"),
    ("text after string", b'cpu f="a"b', InputError, "unexpected 'b'"),
    ("unquoted string", b"cpu f=abc", InputError, "invalid value 'abc'"),
    ("bad float", b"cpu f=1.2.3", InputError, "invalid value '1.2.3'"),
    ("underscore number", b"cpu f=1_000", InputError, "invalid value '1_000'"),
    ("plus sign", b"cpu f=+1", InputError, "invalid value '+1'"),
    ("hex", b"cpu f=0x10", InputError, "invalid value"),
    ("bad integer", b"cpu f=1.5i", InputError, "is not an integer"),
    ("bad unsigned", b"cpu f=-1u", InputError, "is not an unsigned integer"),
    ("int64 overflow", b"cpu f=9223372036854775808i", ValueRangeError, "outside the int64"),
    ("uint64 overflow", b"cpu f=18446744073709551616u", ValueRangeError, "outside the uint64"),
    ("bad boolean", b"cpu f=yes", InputError, "invalid value 'yes'"),
    ("bad boolean case", b"cpu f=tRUE", InputError, "invalid value 'tRUE'"),
    ("NaN", b"cpu f=NaN", ValueRangeError, "NaN and Inf"),
    ("Inf", b"cpu f=-Inf", ValueRangeError, "NaN and Inf"),
    ("float overflow", b"cpu f=1e999", ValueRangeError, "outside the float64 range"),
    ("float timestamp", b"cpu f=1 1.5", InputError, "timestamp '1.5' is not an integer"),
    ("word timestamp", b"cpu f=1 now", InputError, "timestamp 'now' is not an integer"),
    ("two timestamps", b"cpu f=1 1 2", InputError, "unexpected text after the timestamp"),
    ("unescaped space in tag", b"cpu,host=a b f=1", InputError, "field 'b' has no '=value'"),
    ("int64 ns overflow", b"cpu f=1 9223372036854775807", ValueRangeError, "int64"),
    ("huge timestamp", b"cpu f=1 99999999999999999999", ValueRangeError, "int64"),
    ("5000-digit timestamp", b"cpu f=1 " + b"7" * 5000, ValueRangeError, "int64 nanosecond"),
    ("5000-digit integer", b"cpu f=" + b"7" * 5000 + b"i", ValueRangeError, "int64 range"),
    ("5000-digit unsigned", b"cpu f=" + b"7" * 5000 + b"u", ValueRangeError, "uint64 range"),
    ("absurd timestamp", b"cpu f=1 -1", ValueRangeError, "outside the years 1990-2200"),
    ("invalid UTF-8", b"cpu f=1\ncpu,t=\xff f=1", InputError, "line 2 is not valid UTF-8"),
    ("NUL byte", b"cpu f=1\n\ncpu,t=a\x00 f=1", InputError, "line 3 contains a NUL"),
    ("reserved label", b"cpu,metric=a f=1", LabelError, "it is reserved, as"),
    ("reserved label value", b"cpu,value=a f=1", LabelError, "it is reserved, as"),
    ("reserved label timestamp", b"cpu,timestamp=a f=1", LabelError, "it is reserved, as"),
    ("reserved via mapping", b"cpu,time-stamp=1,ts=2 f=1", LabelError, "it is reserved, as"),
    ("dunder label", b"cpu,__name__=a f=1", LabelError, "reserved by Prometheus"),
    ("dunder via mapping", b"cpu,.-x=a f=1", LabelError, "becomes label '__x'"),
    ("duplicate tag", b"cpu,a=1,a=2 f=1", LabelError, "tag 'a' appears more than once"),
    ("tags collide", b"cpu,a.b=1,a-b=2 f=1", LabelError, "'a.b' and 'a-b' all become 'a_b'"),
    ("duplicate field", b"cpu f=1,f=2", LabelError, "field 'f' appears more than once"),
    ("fields collide", b"cpu f.x=1,f-x=2", LabelError, "all become 'cpu_f_x'"),
]


@pytest.mark.parametrize(
    ("body", "error", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_bad_input(body: bytes, error: type[MetricVaultError], message: str) -> None:
    with pytest.raises(error) as info:
        decode(body)
    assert type(info.value) is error
    assert message in info.value.message
    assert info.value.status == 400


def test_error_names_the_line_and_shows_it() -> None:
    body = f"m f=1 {T_NS}\n# comment\nm,host=a f=oops {T_NS}\nm f=2\n"
    with pytest.raises(InputError) as info:
        decode(body)
    assert info.value.message.startswith("line 3: field 'f' has the invalid value 'oops'")
    assert f"The line was 'm,host=a f=oops {T_NS}'" in info.value.message
    assert "nothing was stored" in info.value.message


def test_error_truncates_a_long_line_and_long_values() -> None:
    with pytest.raises(InputError) as info:
        decode(f"m,t={'v' * 1000} f={'x' * 1000}")
    assert f"'m,t={'v' * 195}…'" in info.value.message
    assert f"invalid value '{'x' * 59}…'" in info.value.message
    assert len(info.value.message) < 600


def test_decoder_is_pure() -> None:
    # Every module of both decoders (split by job in issue 12): no store, no file access.
    modules = sorted(Path(influx_line.__file__).parent.glob("*.py"))
    assert len(modules) >= 12
    for module in modules:
        source = module.read_text(encoding="utf-8")
        assert "metricvault.store" not in source, module.name
        assert "open(" not in source, module.name


# --- fuzzing ----------------------------------------------------------------------------------

VALID = [
    f"gpu,Hostname=node-0001,UUID=GPU-1a2b,gpu=0,modelName=NVIDIA\\ H100\\ 80GB util=87.5,"
    f"power=612.25,temp=67i,fb_used=70123u,ok=t {T_NS}",
    f'm,t=a\\,b\\ c\\=d\\\\ f=-1e3,s="q\\"x\\\\",g=FALSE {T_NS}',
    "# comment\r\n  m f=1  \r\n",
]
SPECIAL = [*' ,="\\\n\r\t#=iuteE.-+0123456789', "\\ ", "\\,", "\\=", '\\"', "\\\\", "\ue001"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(st.sampled_from(SPECIAL) | st.text(max_size=3))
        end = at + draw(st.integers(0, 3)) if op != "insert" else at
        text = text[:at] + ("" if op == "delete" else piece) + text[end:]
    return text


# Mostly well-formed pieces and escapes, now and then a raw separator, quote or lone backslash.
ATOMS = ["a", "b", "é", "1", ".", ":", "\\ ", "\\,", "\\=", "\\\\", "\\x", "x\\"] * 3 + list(
    ' ,="\\'
)
TOKEN = st.lists(st.sampled_from(ATOMS), min_size=1, max_size=4).map("".join)
NUMBER = st.sampled_from(["1", "-2.5", "1e3", "7i", "-7i", "8u", "t", "FALSE", ".5", "1.", "x"])


@st.composite
def generated_line(draw: st.DrawFn) -> str:
    """Lines put together from raw tokens, escaped or not, to reach the fast path's escapes."""
    line = draw(TOKEN)
    for _ in range(draw(st.integers(0, 3))):
        line += f",{draw(TOKEN)}={draw(TOKEN)}"
    fields = [f"{draw(TOKEN)}={draw(NUMBER)}" for _ in range(draw(st.integers(1, 3)))]
    line += " " + ",".join(fields)
    if draw(st.booleans()):
        line += " " + draw(st.sampled_from([T_NS, "-1", "12a", T_NS + "\\ "]))
    return line


def decodes_or_refuses(body: bytes, **kwargs: Any) -> None:
    try:
        result = decode_line_protocol(body, now_ms=NOW, **kwargs)
    except MetricVaultError:
        return
    assert isinstance(result, DecodedLines)
    assert result.samples == result.table.num_rows


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(body: bytes) -> None:
    decodes_or_refuses(body)
    decodes_or_refuses(body, content_encoding="gzip")


@settings(deadline=None)
@given(mutated())
def test_fuzz_mutated_valid_bodies(text: str) -> None:
    body = text.encode("utf-8", "surrogatepass")
    decodes_or_refuses(body)
    decodes_or_refuses(gzip.compress(body), content_encoding="gzip", max_decoded_bytes=200)


@settings(deadline=None)
@given(st.lists(generated_line(), max_size=5).map("\n".join))
def test_fuzz_generated_bodies(text: str) -> None:
    decodes_or_refuses(text.encode())


@settings(deadline=None)
@given(mutated())
def test_fast_path_agrees_with_the_scanner(text: str) -> None:
    """Whatever the split-based fast path accepts, the character scanner parses the same way."""
    for line in text.split("\n"):
        line = line.strip(" \t\r")
        if not line or line[0] == "#":
            continue
        fast = influx_line.parse_fast(line)
        if fast is not None:
            assert fast == influx_line.parse_slow(line)


@settings(deadline=None)
@given(generated_line())
def test_fast_path_agrees_with_the_scanner_on_escapes(line: str) -> None:
    fast = influx_line.parse_fast(line)
    if fast is not None:
        assert fast == influx_line.parse_slow(line)


# --- issue 10: request limits and linear cost ------------------------------------------------


def test_series_per_request_counts_metric_and_tag_set() -> None:
    body = "\n".join(f"gpu,gpu={i % 5} util=1,mem=2 {T_NS}" for i in range(50))
    assert decode(body, max_series=10).samples == 100  # 5 tag sets x 2 fields = 10 series
    with pytest.raises(TooLargeError, match=r"more than 9 series .*max_series_per_request"):
        decode(body, max_series=9)


def test_label_names_per_request_counts_labels_not_tag_keys() -> None:
    body = f"gpu,gpu-id=0 a=1 {T_NS}\ngpu,gpu.id=1 a=1 {T_NS}\ngpu,host=h a=1 {T_NS}"
    assert decode(body, max_label_names=2).points == 3  # gpu-id and gpu.id are both gpu_id
    with pytest.raises(TooLargeError, match=r"2 distinct label names \(e\.g\. 'host'\)"):
        decode(body, max_label_names=1)


def test_decode_time_budget_refuses_with_progress() -> None:
    body = "\n".join(f"gpu,gpu={i % 8} util={i} {T_NS}" for i in range(10_000))
    assert decode(body, time_budget_s=60.0).points == 10_000
    with pytest.raises(TooLargeError, match=r"over the budget of 0 s .* after 4,096 of 10,000"):
        decode(body, time_budget_s=0.0)
