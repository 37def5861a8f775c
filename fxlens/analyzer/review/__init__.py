"""Review: comparing two reports, gates on the deltas, `git:` sources."""
