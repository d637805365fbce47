"""Progress bars for the store's callbacks (``maintain(progress=...)``), drawn with rich.

The store only calls ``progress(step, done, total)``; drawing lives here, above the store (the
CLI and the demo both draw it), so ``import metricvault.store`` never loads a terminal library.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import Progress, TaskID


class RichProgress:
    """A ``ProgressCallback`` that shows one bar per step while it runs (transient)."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, step: str, done: int, total: int) -> None:
        task = self._tasks.get(step)
        if task is None:
            task = self._tasks[step] = self._bar.add_task(step, total=total)
        self._bar.update(task, completed=done, total=total)
        if done >= total:  # the step is over: its bar goes, as rich's transient bars do
            self._bar.remove_task(self._tasks.pop(step))


@contextmanager
def console_progress() -> Iterator[RichProgress]:
    """``with console_progress() as progress: vault.maintain(progress=progress)``."""
    with Progress(transient=True) as bar:
        yield RichProgress(bar)
