"""The shell commands that README.md and docs/*.md show, as the docs test runs them.

Every line of a ```sh / ```bash / ```console block is a command (``\\`` continues a line, a
``#`` outside quotes starts a comment, a leading ``$ `` is dropped). ``EXEMPT`` names the few
commands the suite does not run and why; anything else must run, exit 0 and print no
traceback, in the order its page shows it (later commands use what earlier ones made).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = {"sh", "bash", "console", "shell"}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)

# (pattern, reason): commands shown in the docs that this test does not run.
EXEMPT: tuple[tuple[str, str], ...] = (
    (r"^make (demo|test)\b", "the set-up commands themselves: CI runs `make test`; `make demo` "
     "runs `metricvault demo`, which tests/unit/test_cli.py runs on a short simulation"),
    (r"^make bench", "benchmarks are measured in bench/, not in the test suite"),
    (r"^(\.venv/bin/)?python3? bench/", "benchmarks are measured in bench/, not in the suite"),
    (r"^pip install", "installs into the user's environment"),
    (r"^source \.venv/bin/activate", "the test already runs the venv's metricvault"),
    (r"^metricvault serve\b.*--alertmanager", "a server until stopped: tests/e2e/"
     "test_serve_alertmanager.py starts `serve` with rules and an Alertmanager and reads the "
     "alert from its webhook"),
    (r"^metricvault ui\b", "a server until stopped: tests/e2e/test_ui_browser.py starts "
     "`metricvault ui --data ... --listen ...` and drives it in a browser"),
)  # fmt: skip


@dataclass(frozen=True)
class DocCommand:
    page: Path
    line: int
    text: str  # the command without its comment

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def exemption(self) -> str | None:
        for pattern, reason in EXEMPT:
            if re.search(pattern, self.text):
                return reason
        return None


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commands(page: Path) -> list[DocCommand]:
    text = page.read_text()
    found: list[DocCommand] = []
    for fence in _FENCE.finditer(text):
        if fence.group(1) not in SHELL_LANGS:
            continue
        first_line = text.count("\n", 0, fence.start(2)) + 1
        found.extend(_block_commands(page, fence.group(2), first_line))
    return found


def _block_commands(page: Path, body: str, first_line: int) -> list[DocCommand]:
    out: list[DocCommand] = []
    pending, start = "", first_line
    for offset, raw in enumerate(body.splitlines()):
        line = raw.rstrip()
        if not pending:
            start = first_line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = strip_comment(pending + line).strip()
        pending = ""
        full = full.removeprefix("$ ")
        if full:
            out.append(DocCommand(page, start, re.sub(r"\s+", " ", full)))
    return out


def strip_comment(line: str) -> str:
    """Drop a ``#`` comment that is outside quotes and starts a word."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line
