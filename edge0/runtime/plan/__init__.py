"""What a run will be before anything loads: its footprint and its memory plan
(docs/architecture.md).
"""
