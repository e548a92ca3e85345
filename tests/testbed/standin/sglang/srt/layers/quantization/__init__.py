"""Stand-in package (orch test bed)."""
