"""The broker's deterministic state machine: destinations, subscriptions, dispatch, flow control.

No I/O and no awaiting: commands in, messages out, with an injected clock.
"""
