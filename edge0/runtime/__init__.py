"""The streaming runtime, one subpackage per role (docs/architecture.md: the map and the import
rule; docs/runtime.md: how a step runs).
"""
