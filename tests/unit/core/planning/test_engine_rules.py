"""Each engine's rules come from its catalog entry: a new engine is one entry, and an entry that
leaves a rule out is refused when the catalog loads rather than planned with a silent default."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from inference_policy.base.codes import RefusalCode
from inference_policy.base.quantity import GI, MI
from inference_policy.planning.catalog import CatalogError, EngineCatalog, WorkingMemory
from inference_policy.planning.planner import decide
from inference_policy.planning.sizing import CUDA_CONTEXT_BYTES, overhead_bytes
from kits.profilekit import NOW, Owner, request
from policy_io.catalog import catalog_bytes, packaged_catalog
from policy_io.snapshot import PolicySnapshot

OWNER = Owner()


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(catalog_bytes())
    return loaded


def entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [e for e in doc["engines"] if e["engine"] == name]
    [one] = found
    return one


def test_the_packaged_catalog_states_every_gpu_engines_working_memory() -> None:
    catalog = packaged_catalog()
    assert catalog.engines["llamacpp"].working_memory == WorkingMemory(768 * MI)
    assert catalog.engines["vllm"].working_memory == WorkingMemory(1536 * MI)
    assert catalog.engines["diffusion"].working_memory == WorkingMemory(1 * GI, 4)
    assert catalog.engines["whispercpp"].working_memory is None  # CPU only


def test_working_memory_scales_with_the_weights_only_where_the_entry_says() -> None:
    diffusion = WorkingMemory(1 * GI, 4)
    assert overhead_bytes(diffusion, 2 * GI) == CUDA_CONTEXT_BYTES + 1 * GI
    assert overhead_bytes(diffusion, 12 * GI) == CUDA_CONTEXT_BYTES + 3 * GI
    assert overhead_bytes(WorkingMemory(768 * MI), 12 * GI) == CUDA_CONTEXT_BYTES + 768 * MI


def test_a_gpu_engine_without_working_memory_is_refused_at_load() -> None:
    doc = document()
    del entry(doc, "vllm")["workingMemory"]
    with pytest.raises(CatalogError, match="a GPU engine must state its workingMemory"):
        EngineCatalog.from_document(doc)


def test_an_engine_without_model_formats_is_refused_at_load() -> None:
    doc = document()
    del entry(doc, "llamacpp")["modelFormats"]
    with pytest.raises(CatalogError, match="modelFormats"):
        EngineCatalog.from_document(doc)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"refusal": "llamacpp serves gguf models"}, "must name the request's format once"),
        ({"accepts": ["onnx"]}, "accepts"),
        ({"accepts": []}, "accepts"),
    ],
)
def test_a_malformed_format_rule_is_refused_at_load(change: dict[str, Any], message: str) -> None:
    doc = document()
    entry(doc, "llamacpp")["modelFormats"].update(change)
    with pytest.raises(CatalogError, match=message):
        EngineCatalog.from_document(doc)


def test_an_unsupported_key_the_request_does_not_have_is_refused_at_load() -> None:
    doc = document()
    entry(doc, "diffusion")["unsupportedConfig"].append("no_such_key")
    with pytest.raises(CatalogError, match="unsupportedConfig names no configuration key"):
        EngineCatalog.from_document(doc)


def state_with(doc: dict[str, Any]) -> PolicySnapshot:
    return OWNER.state(catalog=EngineCatalog.from_document(doc))


def test_the_format_rule_is_the_catalogs() -> None:
    gguf = request()
    assert decide(gguf, OWNER.state().context(NOW)).allowed
    doc = document()
    entry(doc, "llamacpp")["modelFormats"] = {
        "accepts": ["safetensors"],
        "refusal": "this llamacpp build serves safetensors only; model.format is {format}",
    }
    refused = decide(copy.deepcopy(gguf), state_with(doc).context(NOW))
    assert refused.code is RefusalCode.MODEL_FORMAT and refused.status == 422
    assert refused.detail == "this llamacpp build serves safetensors only; model.format is gguf"


def test_the_refused_configuration_keys_are_the_catalogs() -> None:
    lora = request(config__lora=["adapter"])
    assert decide(lora, OWNER.state().context(NOW)).allowed  # llamacpp's entry refuses none
    doc = document()
    entry(doc, "llamacpp")["unsupportedConfig"] = ["lora"]
    refused = decide(copy.deepcopy(lora), state_with(doc).context(NOW))
    assert refused.code is RefusalCode.CONFIG_UNSUPPORTED
    assert refused.detail == (
        "llamacpp in tenant mode does not support lora; remove lora from the model configuration"
    )
