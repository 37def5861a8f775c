"""Time: the roofline estimate, device calibration, and validation on a real device."""
