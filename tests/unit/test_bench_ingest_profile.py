"""bench/ingest.py's profile summary: py-spy's raw stacks, with ``--threads`` (the
``--profile-gil`` runs) broken down by thread; stacks ending in a wait are left out."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import ingest  # noqa: E402

PROCESS = 'process 7:"python -m metricvault.cli serve"'
STACKS = (
    f"{PROCESS};thread (11): MainThread;run (a/loop.py:1);handle (h11_impl.py:2) 2\n"
    f"{PROCESS};thread (12): AnyIO worker thread;run (t.py:1);decode (rw.py:3) 6\n"
    f"{PROCESS};thread (12): AnyIO worker thread;run (t.py:1);store (v.py:4) 2\n"
    f"{PROCESS};thread (13): AnyIO worker thread;run (t.py:1);Condition.wait (threading.py:5) 9\n"
)


def test_profile_summary_breaks_the_busy_samples_down_by_thread(tmp_path: Path) -> None:
    path = tmp_path / "gateway.txt"
    path.write_text(STACKS)
    lines = ingest.summarize_profile(path)
    assert lines[0].startswith("profile gateway.txt: 10 busy samples")
    assert "9 more ended in a wait" in lines[0]
    assert "top 15 by own time: decode (rw.py:3) 60.0%; handle (h11_impl.py:2) 20.0%" in lines[1]
    by_thread = [line for line in lines if line.startswith("thread ")]
    assert by_thread == [
        "thread 'AnyIO worker thread' 80.0%, its top by own time: decode (rw.py:3) 60.0%; "
        "store (v.py:4) 20.0%",
        "thread 'MainThread' 20.0%, its top by own time: handle (h11_impl.py:2) 20.0%",
    ]
    assert not any("thread (" in line for line in lines)  # the thread frames are no functions


def test_profile_summary_without_threads_has_no_thread_lines(tmp_path: Path) -> None:
    path = tmp_path / "gateway.txt"
    path.write_text(
        STACKS.replace("thread (11): MainThread;", "").replace(
            "thread (12): AnyIO worker thread;", ""
        )
    )
    lines = ingest.summarize_profile(path)
    assert len(lines) == 3 and lines[0].startswith("profile gateway.txt: 10 busy samples")
