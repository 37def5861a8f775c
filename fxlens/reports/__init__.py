"""Pure functions from a Report to text, JSON, DOT, HTML, Markdown. No metric is computed here."""
