"""Ready-made handler modules, named by module path in listen() or a `queasy run` config.

- handlers.dead_letter: a fail handler that records failures in a capped per-queue list.
- handlers.reschedule:  a fail handler that re-dispatches a failed periodic job by its id.
"""
