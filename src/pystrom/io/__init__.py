"""Loaders and writers: PostgreSQL (postgres.py) and Arrow IPC files (arrow.py)."""
