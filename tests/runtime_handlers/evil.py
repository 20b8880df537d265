"""A module a job's data may name; importing or running it leaves a mark in Redis. The
security tests check that a job can never make a worker import or run it."""

from __future__ import annotations

from typing import Any

from tests.runtime_handlers import conn, key

conn().rpush(key("evil"), "imported")


def handle(data: Any, job: Any) -> None:
    conn().rpush(key("evil"), "ran")
