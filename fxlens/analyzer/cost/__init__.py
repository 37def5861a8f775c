"""The cost engine: every node of a graph through the rules, rolled up per module."""
