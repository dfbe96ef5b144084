"""One module per `edge0` subcommand; each exposes `command`."""
