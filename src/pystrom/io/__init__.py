"""Loaders and writers, one subpackage per source: PostgreSQL (:mod:`.postgres`) and Arrow IPC files
(:mod:`.arrow`). Each starts with a docstring that walks its data path in order."""
