"""Moved to :mod:`metricvault.wire.proto` (issue 12); ``messages`` is re-exported here."""
