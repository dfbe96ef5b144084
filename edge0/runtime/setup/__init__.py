"""Building an engine on one machine: plan the memory, load the model, make it stream.

Owns `build` (the Setup an Engine runs with: plan, load, tier stack, scheduler) and
`prepare` (on the compute thread: the predictor, the slot memory and pool, one
stream per streamed layer, the streaming blocks; every mode decided here).
edge0.ranks builds a pipeline's ranks from the same parts. Of the runtime, may import
plan, prefill, compute, layers and io, never engine.
"""
