"""Building an engine on one machine: plan the memory, load the model, make it stream
(docs/architecture.md).
"""
