"""A handler module without a callable handle."""

handle = "not callable"
