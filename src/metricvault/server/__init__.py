"""The HTTP server (``metricvault serve``): one Starlette app over a store, and one module per
API registering its own routes and background tasks (:mod:`metricvault.server.apis`)."""
