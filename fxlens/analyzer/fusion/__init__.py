"""Fusion: the fused-kernel model of a fusing compiler and the pattern findings."""
