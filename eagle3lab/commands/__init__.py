"""CLI subcommands: argument parsing only; each calls a library function."""
