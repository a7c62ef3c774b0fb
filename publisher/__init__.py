"""ZMQ KV event publisher, wire-compatible with vLLM's."""
