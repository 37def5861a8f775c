"""Rule tests: synthetic op calls, table-driven, plus differential tests."""
