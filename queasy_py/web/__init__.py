"""The web dashboard (`queasy dashboard`, the `web` extra: starlette and uvicorn). Never
imported by `import queasy_py`; `from queasy_py.web import create_app, serve` imports
starlette (web/security.py alone does not)."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "serve":
        from .server import serve

        return serve
    raise AttributeError(name)
