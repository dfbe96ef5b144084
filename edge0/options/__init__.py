"""Every engine and sampling option, declared once: the CLI flags and checks derive from it."""
