"""Exit codes of the `queasy` command (documented in the README)."""

OK = 0  # clean shutdown
FAILURE = 1  # an unexpected error, or the server's error reply to a command (OOM, MISCONF)
CONFIG = 2  # bad command line or configuration (the message names the key)
CONNECT = 3  # Redis unreachable or refused the credentials
HANDLER = 4  # a handler module does not import or has no handle()
VERSION = 5  # the server holds a newer major version of the queasy library, or lacks Functions
NOT_FOUND = 6  # an unknown queue or job id (cancel, inspect, requeue --id, ...)
PARTIAL = 7  # queasy status read only part of a Redis Cluster: a primary did not answer
INTERRUPTED = 130  # Ctrl-C (SIGINT) before a supervisor ran, e.g. while waiting for Redis
