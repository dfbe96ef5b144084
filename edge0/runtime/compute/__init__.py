"""The compute thread and what runs on it each step: a request's runner, the step clock, a batch.

Owns `thread` (the one thread that builds and evaluates MLX graphs), `runner` (one
request: its KV cache, a token a step), `steps` (step and request boundaries, per-
step timings, the step fence) and `batch` (one decode step of several requests). Of
the runtime, may import layers and io; never prefill, plan, setup or engine (type-
only imports under TYPE_CHECKING aside).
"""
