"""Persistence: the record format, the journal and its files, recovery, the swap area and the
journal store."""
