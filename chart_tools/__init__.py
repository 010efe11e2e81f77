"""Build steps that derive shipped files from the Helm chart (charts/tmi) and the core.

``python -m chart_tools.generate`` (``make chart``) rewrites the kustomize bases under manifests/
and the chart's generated CEL files; ``--check`` names every stale one. ``chart_tools.render``
renders the chart with the pinned helm, ``chart_tools.toolchain`` finds that helm.

This is product build tooling, not the test harness: it imports the core and nothing of
``localcluster``, ``tests`` or the kits; the harness and the tests import it.
"""
