"""Many GPUs: parallel layouts of a training step, their memory, transfers and time."""
