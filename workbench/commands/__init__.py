"""The ``workbench`` subcommands: each module has ``configure(parser)`` and ``main(args) -> exit code``."""
