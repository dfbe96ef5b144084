"""The compute thread and what runs on it per step: the runner, the step clock, batched steps."""
