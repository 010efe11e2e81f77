"""Kits that the tests and the benchmarks both import, on purpose.

Each module builds what a test or a benchmark drives: signed profiles and owners
(``profilekit``), fleets of nodes (``fleetkit``), the controller's in-memory API
(``controllerkit``), the webhook's and the extender's in-process apps (``webhookkit``,
``extenderkit``, ``memory_sources``), the fake API server (``fakeapi``), the e2e stack and real
node settings (``stackkit``, ``nodekit``) and bounded polling (``polling``). A kit imports the
product packages and the harness (``localcluster``), never ``tests`` or ``bench``; no product
package imports a kit (pyproject.toml, the import contracts). Kits only the tests use stay in
``tests/``.
"""
