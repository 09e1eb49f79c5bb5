"""The load generator: paired, open- and closed-loop load with exact per-request timing."""
