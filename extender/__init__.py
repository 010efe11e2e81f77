"""The scheduler extender: filter and prioritize nodes for planned engine Pods."""
