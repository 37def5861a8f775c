"""Pure functions from a Report to text, JSON, DOT, HTML and Markdown. No metric is computed here."""
