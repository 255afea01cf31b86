"""What governs the model: producer control, limits, transactions, dead letters, cursors,
leases, stages and the disk."""
