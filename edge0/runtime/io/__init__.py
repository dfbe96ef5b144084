"""The I/O side: the scheduler, fetch tickets, reads into the slot pool, slot memory, tracing
(docs/architecture.md).
"""
