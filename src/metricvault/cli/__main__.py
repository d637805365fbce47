"""``python -m metricvault.cli``."""

from metricvault.cli.main import main

main()
