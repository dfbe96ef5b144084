"""The streaming runtime: engine, compute thread, scheduler, tickets, slots, streaming block."""
