"""Alert templates and what Prometheus 2.42 renders for them, for one alert with the labels
``instance="node07:9400", job="gpu"`` and the value ``value``. Shared by the unit tests (our
renderer) and the e2e test that has promtool render the same templates."""

from __future__ import annotations

LABELS = {"instance": "node07:9400", "job": "gpu"}

# (template, value, Prometheus's rendering)
TEMPLATE_CASES: list[tuple[str, float, str]] = [
    ("{{ $labels.instance }} is down", 1.0, "node07:9400 is down"),
    ("{{ .Labels.job }}/{{ $labels.missing }}", 1.0, "gpu/"),
    ("{{ $value }}", 0.5, "0.5"),
    ("{{ $value }}", 1234567.0, "1.234567e+06"),
    ("{{ $value }}", 123456.0, "123456"),
    ("{{ $value }}", 0.00001, "1e-05"),
    ("{{ $value | humanize }}", 1234567.0, "1.235M"),
    ("{{ humanize $value }}", 0.0012, "1.2m"),
    ("{{ $value | humanize }}", 0.0, "0"),
    ("{{ $value | humanize1024 }}", 1073741824.0, "1Gi"),
    ("{{ $value | humanize1024 }}", 512.0, "512"),
    ("{{ $value | humanizePercentage }}", 0.1234, "12.34%"),
    ("{{ $value | humanizeDuration }}", 3725.5, "1h 2m 5s"),
    ("{{ $value | humanizeDuration }}", 90061.0, "1d 1h 1m 1s"),
    ("{{ $value | humanizeDuration }}", 42.123, "42.12s"),
    ("{{ $value | humanizeDuration }}", 0.0015, "1.5ms"),
    ("{{ $value | humanizeTimestamp }}", 1700000000.5, "2023-11-14 22:13:20.5 +0000 UTC"),
    ('{{ printf "%.2f" $value }}', 3.14159, "3.14"),
    ('{{ printf "%s=%v" $labels.job $value }}', 2.0, "gpu=2"),
    ('{{ printf "%d" 42 }}', 1.0, "42"),
    ('{{ printf "%5.1f|%-4s|" $value "ab" }}', 2.25, "  2.2|ab  |"),
    ("{{ if gt $value 80.0 }}hot{{ else }}ok{{ end }}", 91.0, "hot"),
    (
        "{{ if gt $value 80.0 }}hot{{ else if gt $value 50.0 }}warm{{ else }}ok{{ end }}",
        60.0,
        "warm",
    ),
    (
        "{{ range $k, $v := $labels }}{{ $k }}={{ $v }};{{ end }}",
        1.0,
        "instance=node07:9400;job=gpu;",
    ),
    ("{{ with $labels.job }}job {{ . }}{{ end }}", 1.0, "job gpu"),
    ("{{- /* a comment */ -}} x  {{- $labels.job -}}  y", 1.0, "xgpuy"),
    ('{{ reReplaceAll ":[0-9]+$" "" $labels.instance }}', 1.0, "node07"),
    ("{{ $labels.instance | stripPort }}", 1.0, "node07"),
    ('{{ toUpper "gpu" }} {{ toLower "GPU" }} {{ title "node down" }}', 1.0, "GPU gpu Node Down"),
    ('{{ if match "^node0[0-9]" $labels.instance }}yes{{ end }}', 1.0, "yes"),
    ("{{ $x := 3 }}{{ $x }}", 1.0, "3"),
    ('{{ "a\\tb" }}|{{ `raw\\n` }}', 1.0, "a\tb|raw\\n"),
    ('{{ len $labels }} {{ index $labels "job" }}', 1.0, "2 gpu"),
    (
        '{{ and 1 0 }} {{ or 0 "x" }} {{ not true }} {{ eq $labels.job "gpu" "cpu" }}',
        1.0,
        "0 x false true",
    ),
    ('{{ $value | printf "%.1f%%" }}', 99.44, "99.4%"),
    ('{{ print 1 2 "a" 3 }}', 1.0, "1 2a3"),
    ('{{ parseDuration "1h30m" }}', 1.0, "5400"),
]
