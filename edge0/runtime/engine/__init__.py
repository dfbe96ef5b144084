"""The request side, on the event loop: the async `Engine`, `SyncEngine`, the worker paths and one
request's queue (docs/architecture.md).
"""
