"""The pure core of tenant-mode inference: signed owner profiles, engine catalog, planner.

Everything here is deterministic and free of I/O: callers pass in bytes, keys and the clock, and
get back values. The webhook, the scheduler extender, the allocation controller and the owner CLI
all decide through this package, so they cannot disagree.
"""
