"""Quantization: data-free weight scores, calibrated output error, precision plans."""
