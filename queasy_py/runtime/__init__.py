"""The runtime: the supervisor's scheduling loop and lifecycle, the worker pool and its
health, the Redis rounds, scheduling, outcomes, the heartbeat; and the worker process.

It may import the store and the leaf modules (errors, defaults, job, options, validate); it
talks to Redis only through the store. The public API imports it lazily, in run()/listen().
"""
