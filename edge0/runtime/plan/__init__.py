"""What a run will be before anything loads: its footprint and its memory plan.

Owns `footprint` (what a run will hold, read from the files' headers) and `memory`
(the `--memory-budget` plan: slots, RAM cache, prefill chunk). Of the runtime, may
import prefill, compute, layers and io (for their sizes and names), never setup or
engine.
"""
