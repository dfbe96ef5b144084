"""The streaming MoE block and what it asks per layer: its stream, route policies, grouped syncs
(docs/architecture.md).
"""
