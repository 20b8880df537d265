"""Options of the Spark data sources: strings, read by name (case-insensitive), checked."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from .. import defaults
from ..errors import InvalidInput


def resolve_url(url: str | None) -> str:
    """The Redis URL of a data source: its `url` option, else $QUEASY_REDIS_URL, read on the
    driver (executors on other hosts get it from there). Never an embedded server: each
    executor would start its own."""
    url = url or os.environ.get(defaults.URL_ENV)
    if not url:
        raise InvalidInput(
            f"give the queasy data sources .option('url', 'redis://...') or set "
            f"${defaults.URL_ENV} on the driver"
        )
    return url


class Options:
    """The options of one data source, unknown names refused."""

    def __init__(self, options: Mapping[str, str], known: set[str], what: str) -> None:
        self.what = what
        self.values = {str(k).lower(): v for k, v in options.items() if str(k).lower() != "path"}
        by_lower = {name.lower(): name for name in known}
        unknown = sorted(set(self.values) - set(by_lower))
        if unknown:
            raise InvalidInput(f"{what} has no option {unknown[0]!r}; its options: {sorted(known)}")
        self.values = {by_lower[k]: v for k, v in self.values.items()}

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name)
        return default if value is None or value == "" else value

    def required(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise InvalidInput(f"{self.what} needs the option {name!r}")
        return value

    def column(self, name: str, columns: Mapping[str, object]) -> str | None:
        value = self.get(name)
        if value is not None and value not in columns:
            raise InvalidInput(
                f"{self.what}: {name} {value!r} is not a column of the DataFrame "
                f"(its columns: {sorted(columns)})"
            )
        return value

    def columns(self, name: str, columns: Mapping[str, object]) -> tuple[str, ...] | None:
        value = self.get(name)
        if value is None:
            return None
        names = tuple(part.strip() for part in value.split(","))
        for part in names:
            if part not in columns:
                raise InvalidInput(
                    f"{self.what}: {name} names {part!r}, which is not a column of the "
                    f"DataFrame (its columns: {sorted(columns)})"
                )
        if len(set(names)) != len(names):
            raise InvalidInput(f"{self.what}: {name} names a column twice: {value!r}")
        return names

    def boolean(self, name: str, default: bool | None) -> bool | None:
        value = self.get(name)
        if value is None:
            return default
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise InvalidInput(f"{self.what}: {name} must be true or false, not {value!r}")

    def number(self, name: str, default: float) -> float:
        value = self.get(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < 0:
            raise InvalidInput(f"{self.what}: {name} must be a number >= 0, not {value!r}")
        return number

    def whole(self, name: str, default: int | None) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        if not value.isdigit() or int(value) < 1:
            raise InvalidInput(f"{self.what}: {name} must be a whole number >= 1, not {value!r}")
        return int(value)

    def run_at_mode(self, name: str) -> bool | str:
        value = self.get(name, "true")
        modes: dict[str, bool | str] = {
            "true": True, "false": False, "if_later": "if_later", "if_earlier": "if_earlier",
        }  # fmt: skip
        if value.lower() not in modes:
            raise InvalidInput(
                f"{self.what}: {name} must be true, false, if_later or if_earlier, not {value!r}"
            )
        return modes[value.lower()]
