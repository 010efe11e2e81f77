"""Device variables, `envFrom` prefixes and CDI annotation keys in and near the namespaces the
access rule refuses, and that rule restated from its text for the fuzz oracles.

Why it exists: the access rule (`inference_policy.base.access`) refuses a whole namespace of
variables per vendor, every `envFrom` that could land in one, and the CDI annotation keys, on
every container of every Pod. The fuzz targets must try names inside those namespaces, on their
edges (`NVIDIA` without the underscore, `nvidia_`, `XNVIDIA_`, the in-process
`CUDA_VISIBLE_DEVICES`) and far from them, and judge what the servers do with a second statement
of the rule that shares no code with the predicate: if the predicate and this restatement were
both wrong the same way, one more test would not help, but a predicate that forgets a vendor,
mistakes a prefix or checks the wrong key fails here.

The rule, as `docs/threat-model.md` and the access module's docstring state it:

* a variable whose name starts with `NVIDIA_`, `AMD_`, `HABANA_`, `AWS_NEURON_`, `ASCEND_`,
  `ENFLAME_` or `MTHREADS_` is a device variable, on any container (init and ephemeral ones
  too); the one allowed is `NVIDIA_VISIBLE_DEVICES` with the literal value `void`, from no
  source;
* an `envFrom` source with no prefix, or a prefix that some ConfigMap key completes into a
  device variable, is refused on any container;
* a Pod annotation whose key starts with `cdi.k8s.io/` or `nvidia.cdi.k8s.io/` is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.fuzzkit import chance

# Written from the rule's text, not imported: a namespace dropped from the predicate's table is
# then a disagreement the oracle sees.
VENDOR_NAMESPACES = (
    "NVIDIA_",
    "AMD_",
    "HABANA_",
    "AWS_NEURON_",
    "ASCEND_",
    "ENFLAME_",
    "MTHREADS_",
)
SHIELD_NAME, SHIELD_VALUE = "NVIDIA_VISIBLE_DEVICES", "void"
CDI_KEY_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io/")
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")

# Where a variable's name starts: inside each namespace, on its edges, and elsewhere.
NEAR_NAMESPACES = (
    "NVIDIA",
    "NVIDIA__",
    "NVIDIA-",
    "nvidia_",
    "Nvidia_",
    "XNVIDIA_",
    "_NVIDIA_",
    " NVIDIA_",
    "NV_",
    "AMD",
    "amd_",
    "AMDGPU_",
    "HABANA",
    "HABANALABS_",
    "AWS_",
    "AWS_NEURON",
    "AWS_NEURONX_",
    "NEURON_RT_",
    "ASCEND",
    "ENFLAME",
    "MTHREAD_",
    "MTHREADS",
    "CUDA_",
    "HIP_",
    "ROCR_",
    "GPU_",
    "APP_",
)
SUFFIXES = (
    "VISIBLE_DEVICES",
    "DRIVER_CAPABILITIES",
    "REQUIRE_CUDA",
    "DISABLE_REQUIRE",
    "MIG_CONFIG_DEVICES",
    "MIG_MONITOR_DEVICES",
    "IMEX_CHANNELS",
    "GDS",
    "MOFED",
    "NVSWITCH",
    "GDRCOPY",
    "VISIBLE_MODULES",
    "VISIBLE_CORES",
    "RUNTIME_OPTIONS",
    "ALLOW_LINK",
    "SOMETHING_NEW",
    "",
)
# Whole names a person would try, the in-process ones among them (they narrow what a container
# was given and are in no vendor's namespace).
KNOWN_NAMES = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "AMD_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "NEURON_RT_VISIBLE_CORES",
    "ZE_AFFINITY_MASK",
    "GPU_DEVICE_ORDINAL",
    "PATH",
)
device_names = st.one_of(
    st.tuples(st.sampled_from(VENDOR_NAMESPACES), st.sampled_from(SUFFIXES)).map("".join),
    st.tuples(st.sampled_from(NEAR_NAMESPACES), st.sampled_from(SUFFIXES)).map("".join),
    st.sampled_from(KNOWN_NAMES),
    st.text(alphabet="NVIDAMHBSW_nvid", min_size=1, max_size=9),
)
device_values = st.sampled_from(
    ["void", "void", "VOID", "Void", "void ", " void", "all", "", "0", "0,1", "none", "GPU-1"]
)
value_sources = st.sampled_from(
    [
        {"configMapKeyRef": {"name": "devices", "key": "visible"}},
        {"secretKeyRef": {"name": "devices", "key": "visible"}},
        {"fieldRef": {"fieldPath": "metadata.name"}},
    ]
)


@st.composite
def device_env(draw: st.DrawFn, *, valid: bool = False) -> dict[str, Any]:
    """One env entry: a name in or near a device namespace, with a literal value, a source, or
    (unless `valid`: the API server refuses both at once) both."""
    name = draw(device_names)
    how = draw(st.sampled_from(["value"] * 4 + ["source", "none"] + ([] if valid else ["both"])))
    entry: dict[str, Any] = {"name": name}
    if how in ("value", "both"):
        entry["value"] = draw(device_values)
    if how in ("source", "both"):
        entry["valueFrom"] = draw(value_sources)
    return entry


# Prefixes in, on the edge of, and away from the namespaces; None: no prefix at all.
PREFIXES = (
    None,
    "",
    "N",
    "NV",
    "NVIDIA",
    "NVIDIA_",
    "NVIDIA_VISIBLE_",
    "NVIDIAX",
    "A",
    "AM",
    "AMD_",
    "AMDX",
    "AW",
    "AWS_",
    "AWS_NEURON_",
    "AWS_NEURONX",
    "H",
    "HABANA_",
    "ASC",
    "ASCEND_X",
    "E",
    "ENFLAME_",
    "M",
    "MTHREADS_",
    "MX",
    "APP_",
    "nv",
    "nvidia_",
    "XNVIDIA_",
    "CUDA_",
    "B",
    "Z_",
    "_NVIDIA_",
)


@st.composite
def env_from(draw: st.DrawFn, *, valid: bool = False) -> dict[str, Any]:
    """One `envFrom` source, with a prefix from `PREFIXES` or a random one (unless `valid`,
    sometimes one that is not a string at all)."""
    source: dict[str, Any] = draw(
        st.sampled_from([{"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "s"}}])
    )
    source = dict(source)
    prefix = draw(
        st.sampled_from(PREFIXES)
        # A namespace or a near miss, cut short or carried on: `NVIDIA_VISIBLE_`, `NVIDI`.
        | st.tuples(
            st.sampled_from(VENDOR_NAMESPACES + NEAR_NAMESPACES),
            st.sampled_from(["", "X", "VISIBLE_", "GPU_"]),
            st.integers(0, 3),
        ).map(lambda p: (p[0] + p[1])[: len(p[0] + p[1]) - p[2]])
        | st.text(alphabet="NVIDAMHEWSX_", max_size=6)
        | (st.nothing() if valid else st.sampled_from([1, [], {"a": 1}]))
    )
    if prefix is not None:
        source["prefix"] = prefix
    return source


cdi_keys = st.one_of(
    st.sampled_from(
        [
            "cdi.k8s.io/gpu",
            "cdi.k8s.io/extra",
            "nvidia.cdi.k8s.io/gpu",
            "nvidia.cdi.k8s.io/all",
            # Near misses: no slash, another domain, a subdomain, the key as a name.
            "cdi.k8s.io",
            "nvidia.cdi.k8s.io",
            "amd.cdi.k8s.io/gpu",
            "xcdi.k8s.io/gpu",
            "cdi.k8s.io.example.com/gpu",
            "cdi.k8s.iox/gpu",
            "example.com/cdi.k8s.io",
            "k8s.io/cdi",
            "cdi-k8s.io/gpu",
        ]
    ),
    st.tuples(
        st.sampled_from(["cdi.k8s.io/", "nvidia.cdi.k8s.io/", "cdi.k8s.io", "example.com/"]),
        st.text(alphabet="abcgpu0", min_size=1, max_size=6),
    ).map("".join),
)
cdi_values = st.sampled_from(["nvidia.com/gpu=all", "nvidia.com/gpu=0", "vendor.com/x=y", ""])


def add_device_surfaces(
    draw: st.DrawFn,
    spec: dict[str, Any],
    annotations: dict[str, Any],
    *,
    valid: bool = False,
    containers: bool = True,
    cdi: bool = True,
) -> None:
    """Add device variables, `envFrom` sources (to some of `spec`'s containers) and CDI or
    lookalike annotation keys (to `annotations`), in place."""
    if containers:
        for kind in CONTAINER_KINDS:
            entries = spec.get(kind)
            for container in entries if isinstance(entries, list) else ():
                if not isinstance(container, dict):
                    continue
                if chance(draw, 40):
                    env = container.setdefault("env", [])
                    if isinstance(env, list):
                        env.extend(draw(st.lists(device_env(valid=valid), min_size=1, max_size=2)))
                if chance(draw, 25):
                    sources = container.setdefault("envFrom", [])
                    if isinstance(sources, list):
                        sources.append(draw(env_from(valid=valid)))
    if cdi and chance(draw, 35):
        for key in draw(st.lists(cdi_keys, min_size=1, max_size=2)):
            annotations[key] = draw(cdi_values)


def add_one_device_surface(
    draw: st.DrawFn, spec: dict[str, Any], annotations: dict[str, Any], *, valid: bool = False
) -> None:
    """Add one device variable or `envFrom` source (to one of `spec`'s containers) or one CDI or
    lookalike key (to `annotations`), in place: one surface alone, so that a namespace, prefix
    or key a check misses is not hidden behind another it refuses."""
    targets: list[dict[str, Any]] = []
    for kind in CONTAINER_KINDS:
        entries = spec.get(kind)
        targets += [c for c in entries if isinstance(c, dict)] if isinstance(entries, list) else []
    what = draw(st.sampled_from(["env"] * 6 + ["envFrom"] * 2 + ["cdi"] * 2))
    if what == "cdi" or not targets:
        annotations[draw(cdi_keys)] = draw(cdi_values)
        return
    container = draw(st.sampled_from(targets))
    if what == "envFrom":
        sources = container.setdefault("envFrom", [])
        if isinstance(sources, list):
            sources.append(draw(env_from(valid=valid)))
        return
    entry = draw(device_env(valid=valid))
    env = container.get("env")
    # One entry a name, so that the Pod tries one value of it.
    kept = [
        e
        for e in (env if isinstance(env, list) else [])
        if not (isinstance(e, dict) and e.get("name") == entry["name"])
    ]
    container["env"] = [*kept, entry]


# -- the rule, restated ------------------------------------------------------------------------


def _in_a_vendor_namespace(name: str) -> bool:
    return any(name[: len(space)] == space for space in VENDOR_NAMESPACES)


def prefix_reaches(prefix: Any) -> bool:
    """Could an `envFrom` source with this prefix set a device variable? Without a prefix (or
    with one the API server would drop) every key lands as it is, so yes. With one, look for a
    key that makes a device variable of it: the rest of a vendor's namespace, then any name."""
    if not isinstance(prefix, str) or prefix == "":
        return True
    for space in VENDOR_NAMESPACES:
        key = space[len(prefix) :] + "VISIBLE_DEVICES"
        if (prefix + key)[: len(space)] == space:
            return True
    return False


Finding = tuple[str, str, str, str]


def device_findings(pod: Any) -> list[Finding]:
    """Every device variable, `envFrom` source and CDI annotation on `pod` that the rule
    refuses, each as (where, kind, name, value): `where` names the container as the predicate's
    fields do (`spec.<kind>[<name>]`) or the annotation; a value set from a source is
    `valueFrom`, since which source a frozen container reads is not for an UPDATE to change."""
    found: list[Finding] = []
    if not isinstance(pod, Mapping):
        return found
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    for kind in CONTAINER_KINDS:
        entries = spec.get(kind)
        for container in entries if isinstance(entries, list) else ():
            if not isinstance(container, Mapping):
                continue
            where = f"spec.{kind}[{container.get('name')}]"
            env = container.get("env")
            for entry in env if isinstance(env, list) else ():
                if not isinstance(entry, Mapping):
                    continue
                name = entry.get("name")
                if not isinstance(name, str) or not _in_a_vendor_namespace(name):
                    continue
                literal = entry.get("valueFrom") is None
                value = entry.get("value") if literal else "valueFrom"
                if literal and name == SHIELD_NAME and value == SHIELD_VALUE:
                    continue
                found.append((where, "env", name, json.dumps(value)))
            sources = container.get("envFrom")
            for source in sources if isinstance(sources, list) else ():
                if isinstance(source, Mapping) and prefix_reaches(source.get("prefix")):
                    found.append((where, "envFrom", json.dumps(source.get("prefix")), ""))
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    for key, value in annotations.items() if isinstance(annotations, Mapping) else ():
        if isinstance(key, str) and any(key[: len(p)] == p for p in CDI_KEY_PREFIXES):
            found.append((f"metadata.annotations[{key}]", "cdi", key, json.dumps(value)))
    return found


_LOOKALIKE = ("NVIDIA", "AMD", "HABANA", "NEURON", "ASCEND", "ENFLAME", "MTHREAD", "CUDA", "HIP")


def surfaces(pod: Any) -> set[str]:
    """Which of the device surfaces `pod` carries, refused or near misses, for the counters."""
    found: set[str] = set()
    findings = device_findings(pod)
    kinds = {kind for _, kind, _, _ in findings}
    if "env" in kinds:
        found.add("device-variable")
    if "envFrom" in kinds:
        found.add("env-from-reaching")
    if "cdi" in kinds:
        found.add("cdi-annotation")
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    for kind in CONTAINER_KINDS:
        entries = spec.get(kind) if isinstance(spec, Mapping) else None
        for container in entries if isinstance(entries, list) else ():
            if not isinstance(container, Mapping):
                continue
            env = container.get("env")
            for entry in env if isinstance(env, list) else ():
                name = entry.get("name") if isinstance(entry, Mapping) else None
                if not isinstance(name, str):
                    continue
                if name == SHIELD_NAME and entry.get("value") == SHIELD_VALUE:
                    found.add("shield")
                elif not _in_a_vendor_namespace(name) and any(
                    word in name.upper() for word in _LOOKALIKE
                ):
                    found.add("lookalike-variable")
            sources = container.get("envFrom")
            for source in sources if isinstance(sources, list) else ():
                if isinstance(source, Mapping) and not prefix_reaches(source.get("prefix")):
                    found.add("env-from-safe-prefix")
    metadata = pod.get("metadata") if isinstance(pod, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    for key in annotations if isinstance(annotations, Mapping) else ():
        if isinstance(key, str) and "cdi" in key and not key.startswith(CDI_KEY_PREFIXES):
            found.add("cdi-lookalike")
    return found


def new_device_findings(pod: Any, old: Any) -> list[Finding]:
    """What an UPDATE adds: findings of `pod` that `old` did not have, value and all."""
    before = set(device_findings(old))
    return [found for found in device_findings(pod) if found not in before]


def missed_by(fields: list[str], findings: list[Finding]) -> list[Finding]:
    """The findings the predicate's reaches (their `fields`) do not name: an env entry where no
    reach names that container's variable, an `envFrom` or annotation where none names it."""
    missed: list[Finding] = []
    for found in findings:
        where, kind, name, _ = found
        if kind == "env":
            named = f"{where}.env[{name}]" in fields
        elif kind == "envFrom":
            named = f"{where}.envFrom" in fields
        else:
            named = where in fields
        if not named:
            missed.append(found)
    return missed


__all__ = [
    "VENDOR_NAMESPACES",
    "Finding",
    "add_device_surfaces",
    "add_one_device_surface",
    "cdi_keys",
    "device_env",
    "device_findings",
    "env_from",
    "missed_by",
    "new_device_findings",
    "prefix_reaches",
    "surfaces",
]
