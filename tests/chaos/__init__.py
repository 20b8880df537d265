"""The chaos test of issue 4: supervisors killed, frozen and restarted at random while
handlers misbehave, with the invariants of tests/chaos/invariants.py checked throughout.

    python -m tests.chaos --seconds 60 --processes 3 [--url URL] [--seed S]
"""
