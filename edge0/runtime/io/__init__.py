"""The I/O side: the scheduler, fetch tickets, reads into the slot pool, slot memory, tracing.

Owns how an expert gets from a tier into a slot and when a slot may be reused:
`scheduler` (compute's side: step boundaries, slot claims, the fence), `issue`
(reservations and tickets), `planner` (the thread that applies deferred work),
`fetcher` and `readers` (reads and their counters), `route_slots` (what route
policies ask of the slots), `tickets`, `slots` (the pool), `slotmem` (its memory)
and `trace`. Imports no other runtime package.
"""
