"""Moved to :mod:`metricvault.progressbar` (issue 12): the demo draws it too, and the demo may
not import the CLI layer."""

from metricvault.progressbar import RichProgress as RichProgress  # moved: issue 12
from metricvault.progressbar import console_progress as console_progress  # moved: issue 12
