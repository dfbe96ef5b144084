"""The request side: the async `Engine`, `SyncEngine`, the worker paths and one request's queue.

Owns what happens on the event loop between a caller and the compute thread: `api`
(Engine.open / generate, the worker task), `solo` (one request at a time) and
`batcher` (continuous batching), `requests` (a request's token queue), `summary`
(the end-of-run figures), `sync` (the blocking wrapper). May import every runtime
package below it, and edge0.ranks (a pipeline's rank 0 is built in Engine.open).
"""
