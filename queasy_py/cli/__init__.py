"""The `queasy` command: its subcommands (main), its TOML config (config), its exit codes.

It uses the public API (Client, Queue, errors, defaults) and the store's embedded server; the
runtime only through Client.run().
"""

from .main import main

__all__ = ["main"]
