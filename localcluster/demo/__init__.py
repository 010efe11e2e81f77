"""``make demo``: ``python -m localcluster.demo`` (the owner's workflow, ``workflow``) and ``python
-m localcluster.demo.guard``; ``dra`` and ``node`` are its later parts.
"""
