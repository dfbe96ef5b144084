"""The prompt: a chunk of tokens per forward through the streamed layers, its reads, its memory
(docs/architecture.md).
"""
