"""What goes over the wire between the agent and the gateway: protobuf schemas, the
remote-write encoder, header names. A leaf: both ``collect`` (the agent) and ``ingest`` (the
gateway) import it, and it imports neither, nor pyarrow, numpy or the store."""
