"""Distributed preflight: what every rank of a job sees, and what its links should do."""
