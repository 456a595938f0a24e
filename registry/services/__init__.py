"""Writes. Each service takes an Actor, checks access through core.access,
changes rows inside one transaction and records the audit event with them."""
