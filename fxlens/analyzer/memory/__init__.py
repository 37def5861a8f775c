"""Memory: liveness over a graph, the simulated eager peak, training state and step, KV cache."""
