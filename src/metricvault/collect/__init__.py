"""What produces the metrics: the agent (NVML, host, simulated GPUs, log watcher), the push
client, the training-loop API and the inference middleware."""
