"""Broker clusters on a shared PostgreSQL database: membership, heartbeats and fencing, failure
detection and takeover, and the links that carry messages between members (docs/cluster.md)."""
