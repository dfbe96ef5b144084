"""The request side: the async `Engine`, its worker paths (solo, batcher), requests, setup."""
