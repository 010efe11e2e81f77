"""The machinery the tmi servers share, so that the webhook, the extender and the controller
start, serve and stop the same way.

Settings from flags and `TMI_*` environment variables (`settings`), the entry point's exit
statuses and the aiohttp runner with its signal handling, drain and graceful shutdown
(`process`), the health and metrics endpoints (`probes`) and the profile gauges (`metrics`), the
serving certificate reloader (`tls`), the Kubernetes client configuration and its errors
(`kube`), the aiohttp client for the API server (`apiserver`), the one list-and-watch loop
every server follows the cluster with (`informer`) and what it follows the signed profile
revisions by in follow mode (`revisions`). The servers may not import one another;
they import this instead. What differs between them (their settings, routes and sources) stays
with each server.
"""
