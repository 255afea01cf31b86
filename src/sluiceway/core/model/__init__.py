"""The broker's model: destinations, subscriptions, durable state, dispatch, and the store
they report to."""
