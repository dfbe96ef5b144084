"""The compute thread and what runs on it each step: a request's runner, the step clock, a batch
(docs/architecture.md).
"""
