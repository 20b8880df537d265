"""A handler module that cannot be imported."""

raise RuntimeError("this handler module is broken on purpose")
