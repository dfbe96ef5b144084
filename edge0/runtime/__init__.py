"""The streaming runtime, one subpackage per role, each importing only those below it.

From the top: `engine` (the request side: the async Engine, its worker paths,
requests), `setup` (making an engine from a checkpoint), `plan` (options,
footprint and memory plan, before anything loads), `prefill` (the prompt in
chunks), `compute` (the compute thread, a request's runner, the step clock),
`layers` (the streaming MoE block and what it asks per layer), `io` (the
scheduler, tickets, reads, the slot pool and its memory). docs/architecture.md
has the rule; tests/test_architecture.py checks it.
"""
