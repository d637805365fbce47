"""metricvault test suite (a package so mypy names its modules tests.*)."""
