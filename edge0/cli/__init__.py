"""The `edge0` command line: `main.py` is the click group, one module per subcommand."""
