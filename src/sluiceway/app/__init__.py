"""The wiring on top: storage opened, the broker built, listeners and admin services started."""
