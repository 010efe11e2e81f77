"""Installing the project on the local cluster: the chart's install (rendered by
chart_tools.render), the whole stack and its settings, tenants, the image, and the Kubernetes
version checks.
"""
