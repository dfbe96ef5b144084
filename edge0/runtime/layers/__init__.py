"""The streaming MoE block and what it asks per layer: its stream, route policies, grouped syncs.

Owns `block` (StreamingMoE: the router, then the experts over the slot table),
`streams` (one collaborator per streamed layer: planned set, routing sync, prefetch,
slots), `policy` and `policy_graph` (which experts a route-mode layer runs) and
`syncs` (route mode's host work in groups of layers). Of the runtime, may import io
only; the step clock, a batch or a prompt chunk reach a block through its stream's
`steps`, never by import.
"""
