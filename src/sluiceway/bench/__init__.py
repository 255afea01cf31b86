"""`sluiceway bench`: a load generator that measures any STOMP 1.2 broker the same way.

- `stream`: one STOMP connection over asyncio streams, and a sampler of a process's memory.
- `accounting`: what a consumer keeps per message, in bounded memory (sequence bitmaps, a
  latency histogram with log buckets, a per-second series).
- `occupancy`: what a consumer holds (received, not acknowledged) and when it has nothing to do.
- `workers`: the producer and consumer processes (each an asyncio loop).
- `runner`: starts the processes for a scenario, waits, and gathers their results.
- `report`: the figures, as a table, JSON and a plot.
- `command`: the command line.
"""
