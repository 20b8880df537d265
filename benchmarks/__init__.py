"""Benchmarks of queasy_py side by side with other Python job queues (see README.md)."""
