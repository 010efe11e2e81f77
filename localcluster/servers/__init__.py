"""The project's servers run against the local cluster: the webhook, the scheduler extender and the
allocation controller as processes, their objects, the guard and the owner's admission policies,
engine Pods and injected faults.
"""
