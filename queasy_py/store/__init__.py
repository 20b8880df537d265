"""The store: everything that speaks Redis (library load and handshake, keys, connections,
FCALL paths, the pipelined round connection, pub/sub, the embedded server).

It may import the package's leaf modules (errors, defaults, job, validate) and nothing else
of queasy_py: it knows nothing of the runtime, the public API or the interfaces.
"""
