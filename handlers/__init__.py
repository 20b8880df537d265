"""Ready-made handler modules, named by module path in listen() or a `queasy run` config.

- queasy_py.handlers.dead_letter: a fail handler recording failures in a capped per-queue list.
- queasy_py.handlers.reschedule:  a fail handler re-dispatching a failed periodic job by its id.

The repository keeps them in its top-level handlers/ folder; the wheel installs them as the
package queasy_py.handlers (pyproject.toml package-dir), never as a top-level `handlers`
package, which would hide or be hidden by a user's own `handlers`. The old names
`handlers.dead_letter` and `handlers.reschedule` are gone.
"""
