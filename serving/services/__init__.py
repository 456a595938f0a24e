"""Writes for the serving control plane. Each takes an Actor (or runs as the
system from a task), applies one state table, audits, and enqueues on commit."""
