"""The I/O room: a slot table, a fetcher and a planner, composed by the scheduler; the Protocols
the other rooms see (docs/runtime.md, "The I/O room")."""
