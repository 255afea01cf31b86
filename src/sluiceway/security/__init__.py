"""Who may use the broker: the users file, credentials, access rules, and the exposure check."""
