"""Fixes: when something does not fit, the changes that make it fit, each re-estimated."""
