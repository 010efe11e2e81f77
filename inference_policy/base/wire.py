"""The names on the wire (contract section 1), defined once for every component.

The webhook writes them, the extender and the controller read them, and the owner and tenant
tooling matches on them; a typo in any one copy would silently break the chain, so there is
only this copy.
"""

ENGINE_LABEL = "kamiwaza.ai/deployment-id"
OPT_IN_LABEL = "kamiwaza.ai/tenant-inference"
OPT_IN_VALUE = "enabled"
REQUEST_ANNOTATION = "kamiwaza.ai/deployment-request"
PLAN_ANNOTATION = "kamiwaza.ai/plan"
ENGINE_CONTAINER_ANNOTATION = "kamiwaza.ai/engine-container"
ALLOCATION_VERIFIED = "kamiwaza.ai/AllocationVerified"
VRAM_RESOURCE_PREFIX = "kamiwaza.ai/vram-gb-"
# The NVIDIA device plugin's names: a whole GPU, and a MIG slice under the mixed strategy.
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# The largest deployment-request annotation read (the API server caps all annotations at 256 KiB).
MAX_REQUEST_ANNOTATION_BYTES = 256 * 1024
