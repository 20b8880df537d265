"""The async handler of the bad-input tests (runtime_handlers/rude.py)."""

from .rude import handle_async as handle

__all__ = ["handle"]
