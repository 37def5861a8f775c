"""Serving estimates: prefill, decode steps, capacity and the throughput-latency curve."""
