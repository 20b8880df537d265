"""A handler whose handle is a class: calling it makes an instance (refused at load)."""

from typing import Any


class handle:  # noqa: N801 - the name a handler module must define
    def __init__(self, data: Any, job: Any) -> None:
        self.data = data
