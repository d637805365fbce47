"""``python -m metricvault.cli``."""

from metricvault.cli import main

main()
