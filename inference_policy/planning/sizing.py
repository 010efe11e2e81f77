"""How much GPU memory a deployment holds: the one place the sizing formula and its constants live.

    need = weights + attention cache at the context + engine overhead

Every constant below is grounded in a published measurement (see docs/sizing.md, which quotes
them): the estimate must be at or above what the engine really holds, because an estimate that
is too small places a model on a device where it then fails to load, while one that is slightly
too large only picks the next larger binding.

- Attention cache: 2 (K and V) x layers x kvHeads x headDim x 2 bytes (f16) per token. This is
  exact against llama.cpp's `KV self size` logs and vLLM's block accounting (131,072 B/token for
  Llama 3.1 8B).
- When the model does not describe its attention shape, the cache is bounded from the weights:
  128 KiB per token for every GiB of weights. That is the size of an ungrouped (no GQA) 7B model
  in 4-bit (Llama 2 7B: 512 KiB/token at 3.9 GiB) and several times a grouped one, so the bound
  errs towards the larger binding.
- Overhead per device: the CUDA context (a few hundred MiB per process, 512 MiB here) plus the
  engine's working memory, which each engine's catalog entry states (`workingMemory`):
  llama.cpp's compute buffer (560 MiB measured at n_ctx 8192, 768 MiB
  here), vLLM's activation peak and non-torch memory (1.31 GiB measured on an 80 GB card, 1.5
  GiB here), and a diffusion pipeline's activations (a quarter of the weights, at least 1 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_policy.base.quantity import GI, MI, ceil_div
from inference_policy.planning.catalog import WorkingMemory

KV_BYTES_PER_ELEMENT = 2
CUDA_CONTEXT_BYTES = 512 * MI
FALLBACK_KV_BYTES_PER_TOKEN_PER_GIB = 128 * 1024
CPU_MEMORY_FACTOR_NUM, CPU_MEMORY_FACTOR_DEN = 5, 4


@dataclass(frozen=True, slots=True)
class Estimate:
    """A request's GPU memory, in its parts."""

    weights: int
    cache: int
    overhead_per_device: int
    devices: int

    @property
    def total(self) -> int:
        return self.weights + self.cache + self.overhead_per_device * self.devices

    @property
    def per_device(self) -> int:
        """What each device must hold: its share of weights and cache, plus its own overhead."""
        return ceil_div(self.weights + self.cache, self.devices) + self.overhead_per_device


def kv_cache_bytes(
    context: int, layers: int | None, kv_heads: int | None, head_dim: int | None, weights: int
) -> int:
    if layers and kv_heads and head_dim:
        per_token = 2 * layers * kv_heads * head_dim * KV_BYTES_PER_ELEMENT
    else:
        per_token = ceil_div(weights * FALLBACK_KV_BYTES_PER_TOKEN_PER_GIB, GI)
    return per_token * context


def overhead_bytes(working: WorkingMemory, weights: int) -> int:
    """Per device: the CUDA context and the engine's own working memory (its catalog entry)."""
    return CUDA_CONTEXT_BYTES + working.bytes_for(weights)


def estimate_gpu(
    working: WorkingMemory,
    weights: int,
    context: int | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    devices: int,
) -> Estimate:
    cache = 0 if context is None else kv_cache_bytes(context, layers, kv_heads, head_dim, weights)
    return Estimate(weights, cache, overhead_bytes(working, weights), devices)


def cpu_memory_bytes(weights: int, floor: int) -> int:
    """At least 1.25 times the weights, rounded up to a whole GiB, never below the floor."""
    scaled = ceil_div(weights * CPU_MEMORY_FACTOR_NUM, CPU_MEMORY_FACTOR_DEN)
    return max(floor, ceil_div(scaled, GI) * GI)
