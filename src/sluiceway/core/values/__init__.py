"""Values every layer of the core uses: messages, time, flow windows, counts, selectors and
memory levels."""
