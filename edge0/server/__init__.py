"""`edge0 serve`: an OpenAI- and Anthropic-compatible HTTP server on the async engine."""
