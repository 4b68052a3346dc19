"""The operator tools behind the CLI: each returns values, none renders."""
