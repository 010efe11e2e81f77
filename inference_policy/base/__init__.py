"""The base: the vocabulary every part of the core speaks, and decides nothing with.

The names on the wire (`wire`), the one Kubernetes quantity grammar (`quantity`), strict JSON
for everything that crosses a trust boundary (`strictjson`), the one eviction rule of the hot
paths' caches (`bounded`), pydantic's errors as one sentence (`errors`), a CEL string literal
(`cel_text`), a stored Pod or any object read as absent where its fields have the wrong shape
(`pod_view`: every server and part reads a Pod through it), what counts as reaching for an
accelerator (`access`: the webhook, the controller and the API server's CEL must never disagree
on it) and every stable code an outcome carries (`codes`: refusals, node verdicts,
AllocationVerified reasons).

May import: nothing of the core outside the base. Every other part may import it
(`[tool.importlinter]` in pyproject.toml holds the layers).
"""
