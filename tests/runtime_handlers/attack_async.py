"""The async handler of tests/test_worker_attack.py (runtime_handlers/attack.py)."""

from .attack import handle_async as handle

__all__ = ["handle"]
