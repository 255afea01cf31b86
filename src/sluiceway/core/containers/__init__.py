"""Ordered message containers that spill to the swap area.

Pending lists, spilling runs and sequence logs.
"""
