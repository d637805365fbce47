"""One pure decoder module per wire protocol: request bytes in, an Arrow table out, no I/O."""
