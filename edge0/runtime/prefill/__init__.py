"""Chunked prefill: a prompt chunk through the streamed layers, its reads, its memory bound."""
