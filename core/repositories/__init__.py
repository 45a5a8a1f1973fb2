"""Queries, and only queries: services call these and never build SQL themselves."""
