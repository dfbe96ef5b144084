"""The I/O side: the scheduler, tickets, reads into the slot pool, the slot memory, tracing."""
