"""Operating the broker: snapshots of its state, metrics, and the admin endpoint serving them."""
