"""Fuzzing what reaches the servers besides reviews and scheduler calls: profile ConfigMaps and
their DSSE envelopes, deployment requests at `POST /v1/plan`, plan annotations, and the
servers' settings from flags and variables.

Oracles:

* profile ConfigMaps: verification accepts a ConfigMap only when it is exactly what the owner
  signed for this cluster and namespace, checked here from first principles (the digest, the
  Ed25519 signature over the DSSE PAE of the payload with the owner's key, the canonical
  payload, the target, `immutable`); anything else is refused with `ProfileRefused` and no
  other exception; the servers' edge (`PolicyState.set_profile`) never raises and holds a
  profile exactly when verification accepted. Each tampered ConfigMap is a forgery tried; an
  accepted one is a forged grant.
* `/v1/plan`: never a 5xx; a 200 is a plan the one plan parser accepts, equal to the `tmi
  plan` decision for the same request, granting a binding the verified profile holds; a
  refusal carries its status and detail.
* plan annotations: `parse_plan` raises only `PlanError`; an accepted plan round-trips to the
  same text and holds its path's invariants (a gpu plan's limits equal its requests).
* settings: each server's `settings_from_args` returns settings or refuses with `ConfigError`
  (or argparse's exit status 2), never another exception; a whole-number setting it accepts is
  the number that was written.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from allocation_controller.config import settings_from_args as controller_settings
from extender.config import settings_from_args as extender_settings
from inference_policy.base import strictjson
from inference_policy.planning.plan import Plan, PlanError, parse_plan
from inference_policy.trust.profile import ExtendedResourceBinding, VramPluginBinding
from inference_policy.trust.signing import (
    BUNDLE_KEY,
    DIGEST_KEY,
    PAYLOAD_TYPE,
    ProfileRefused,
    canonical,
    pae,
    verify_configmap,
)
from kits.profilekit import CLUSTER, NAMESPACE, NOW, Owner
from kits.webhookkit import published, webhook_app
from policy_io.catalog import packaged_catalog
from policy_io.state import PolicyState
from serving.settings import ConfigError
from tests.fuzz import corpus
from tests.fuzz.fuzzkit import (
    AppDriver,
    Stats,
    fuzz_settings,
    garbled,
    json_values,
    mutated,
    recorded,
)
from webhook.config import settings_from_args as webhook_settings

OWNER = corpus.OWNER
ATTACKER = Ed25519PrivateKey.generate()
ENVELOPE_PATHS = [
    ("version",),
    ("clusterBindingId",),
    ("namespace",),
    ("issuedAt",),
    ("expiresAt",),
    ("keyId",),
    ("profiles",),
    ("profiles", 1, "bindings", 0, "resource"),
    ("profiles", 1, "bindings", 0, "accelerator"),
    ("profiles", 2, "guarantees"),
]


# -- profile ConfigMaps ------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _bundle(payload: bytes, signatures: list[dict[str, Any]], **extra: Any) -> str:
    document = {"payloadType": PAYLOAD_TYPE, "payload": _b64(payload), "signatures": signatures}
    document.update(extra)
    return canonical(document).decode()


def _publish(configmap: dict[str, Any], bundle: str) -> dict[str, Any]:
    configmap["data"] = {
        BUNDLE_KEY: bundle,
        DIGEST_KEY: hashlib.sha256(bundle.encode()).hexdigest(),
    }
    return configmap


@st.composite
def configmaps(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A published profile ConfigMap and the tampering it went through ("none": as signed)."""
    envelope = copy.deepcopy(corpus.ENVELOPE)
    if draw(st.booleans()):
        path = draw(st.sampled_from(ENVELOPE_PATHS))
        target: Any = envelope
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = draw(json_values)
    try:
        configmap = OWNER.sign(envelope)
    except ValueError:
        configmap = OWNER.sign(corpus.ENVELOPE)  # not canonical JSON: signing refuses it
    bundle = json.loads(configmap["data"][BUNDLE_KEY])
    payload = base64.b64decode(bundle["payload"])
    signature = bundle["signatures"][0]
    attack = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "payload-bit",
                "signature-bit",
                "attacker-key",
                "attacker-claims-owner",
                "other-payload-type",
                "pretty-payload",
                "padded-base64",
                "repeated-signature",
                "extra-field",
                "digest",
                "mutable",
                "name",
                "namespace",
                "subtree",
                "bytes",
            ]
        )
    )
    if attack == "payload-bit":
        index = draw(st.integers(0, len(payload) - 1))
        flipped = bytearray(payload)
        flipped[index] ^= 1 << draw(st.integers(0, 7))
        _publish(configmap, _bundle(bytes(flipped), [signature]))
    elif attack == "signature-bit":
        raw = bytearray(base64.b64decode(signature["sig"]))
        raw[draw(st.integers(0, 63))] ^= 1 << draw(st.integers(0, 7))
        _publish(configmap, _bundle(payload, [{**signature, "sig": _b64(bytes(raw))}]))
    elif attack in ("attacker-key", "attacker-claims-owner"):
        forged = copy.deepcopy(corpus.ENVELOPE)
        forged["profiles"][1]["bindings"][0]["resource"]["quantity"] = 8
        forged_payload = canonical(forged)
        sig = _b64(ATTACKER.sign(pae(PAYLOAD_TYPE, forged_payload)))
        keyid = signature["keyid"] if attack == "attacker-claims-owner" else "sha256:" + "0" * 64
        _publish(configmap, _bundle(forged_payload, [{"keyid": keyid, "sig": sig}]))
    elif attack == "other-payload-type":
        sig = _b64(OWNER.key.sign(pae("application/json", payload)))
        bundle_text = canonical(
            {
                "payloadType": "application/json",
                "payload": _b64(payload),
                "signatures": [{"keyid": signature["keyid"], "sig": sig}],
            }
        ).decode()
        _publish(configmap, bundle_text)
    elif attack == "pretty-payload":
        pretty = json.dumps(json.loads(payload), indent=2).encode()
        sig = _b64(OWNER.key.sign(pae(PAYLOAD_TYPE, pretty)))
        _publish(configmap, _bundle(pretty, [{"keyid": signature["keyid"], "sig": sig}]))
    elif attack == "padded-base64":
        text = signature["sig"]
        # The last character before the padding carries unused bits: a second spelling of
        # the same signature bytes.
        last = text[-3]
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        twin = alphabet[alphabet.index(last) ^ 1]
        _publish(configmap, _bundle(payload, [{**signature, "sig": text[:-3] + twin + "=="}]))
    elif attack == "repeated-signature":
        _publish(configmap, _bundle(payload, [signature, signature]))
    elif attack == "extra-field":
        _publish(configmap, _bundle(payload, [signature], note="unsigned"))
    elif attack == "digest":
        configmap["data"][DIGEST_KEY] = "0" * 64
    elif attack == "mutable":
        configmap["immutable"] = draw(st.sampled_from([False, None, "true", 1]))
    elif attack == "name":
        configmap["metadata"]["name"] = "another-profile"
    elif attack == "namespace":
        configmap["metadata"]["namespace"] = "elsewhere"
    elif attack == "subtree":
        configmap = draw(mutated(configmap, 2))
    elif attack == "bytes":
        text = configmap["data"][BUNDLE_KEY].encode()
        configmap["data"][BUNDLE_KEY] = draw(garbled(text)).decode("utf-8", "replace")
    return configmap, attack


def _authentic(configmap: Any) -> bool:
    """Is this ConfigMap exactly what the owner signed for this cluster and namespace?"""
    try:
        data = configmap["data"]
        bundle_text = data[BUNDLE_KEY].encode()
        if hashlib.sha256(bundle_text).hexdigest() != data[DIGEST_KEY]:
            return False
        bundle = json.loads(bundle_text)
        if set(bundle) != {"payloadType", "payload", "signatures"}:
            return False
        if bundle["payloadType"] != PAYLOAD_TYPE or len(bundle["signatures"]) != 1:
            return False
        payload = base64.b64decode(bundle["payload"], validate=True)
        if _b64(payload) != bundle["payload"]:
            return False
        sig_text = bundle["signatures"][0]["sig"]
        sig = base64.b64decode(sig_text, validate=True)
        if _b64(sig) != sig_text:
            return False
        OWNER.key.public_key().verify(sig, pae(PAYLOAD_TYPE, payload))
        document = json.loads(payload)
        if canonical(document) != payload:
            return False
        return bool(
            configmap.get("kind") == "ConfigMap"
            and configmap.get("immutable") is True
            and configmap["metadata"]["name"] == "kamiwaza-inference-profiles"
            and configmap["metadata"].get("namespace") in (None, NAMESPACE)
            and document["clusterBindingId"] == CLUSTER
            and document["namespace"] == NAMESPACE
        )
    except (InvalidSignature, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return False


def test_fuzz_profile_configmaps() -> None:
    policy = OWNER.policy()
    with recorded(Stats("profile-configmaps")) as stats:

        @fuzz_settings(200)
        @given(configmaps())
        def run(case: tuple[dict[str, Any], str]) -> None:
            configmap, attack = case
            forged = attack != "none" and not _authentic(configmap)
            stats.forgeries_tried += forged
            try:
                verify_configmap(configmap, policy, NOW)
                accepted = True
            except ProfileRefused as refusal:
                assert refusal.check
                accepted = False
            if accepted and (forged or not _authentic(configmap)):
                stats.forged_grants += 1
                raise AssertionError(f"a ConfigMap tampered by {attack!r} was accepted")
            state = PolicyState(OWNER.settings(), packaged_catalog())
            state.set_profile(configmap, "rev", NOW)
            assert (state.profile is not None and state.profile_refusal is None) == accepted
            stats.saw("accepted" if accepted else f"refused-{attack}")

        run()
    assert stats.forged_grants == 0


# -- deployment requests at /v1/plan ---------------------------------------------------------


@pytest.fixture(scope="module")
def webhook() -> Iterator[AppDriver]:
    configmaps = {"kamiwaza-inference-profiles": published(OWNER.sign(corpus.ENVELOPE))}
    app, _, _ = webhook_app(OWNER, configmaps, **corpus.WEBHOOK_SETTINGS)
    driver = AppDriver(app)
    yield driver
    driver.close()


request_bodies = st.one_of(
    st.sampled_from(corpus.requests()).flatmap(lambda r: mutated(r, 3)).map(json.dumps),
    json_values.map(json.dumps),
).map(str.encode) | st.sampled_from(corpus.requests()).map(
    lambda r: json.dumps(r).encode()
).flatmap(garbled)


def test_fuzz_plan_api(webhook: AppDriver) -> None:
    profile = verify_configmap(OWNER.sign(corpus.ENVELOPE), OWNER.policy(), NOW)
    with recorded(Stats("deployment-requests")) as stats:

        @fuzz_settings(300)
        @given(request_bodies)
        def run(body: bytes) -> None:
            status, data = webhook.post("/v1/plan", body)
            assert status < 500 or status == 503, (status, data[:300])
            answer = orjson.loads(data)
            try:
                document = strictjson.loads(body)
            except strictjson.StrictJSONError:
                assert status == 400, (status, answer)
                stats.saw("400")
                return
            decision = corpus.state().decide(document, NOW)
            assert status == decision.status, (status, decision.status, answer)
            assert answer == decision.body
            stats.saw(str(status))
            if status != 200:
                assert isinstance(answer.get("detail"), str) and answer["detail"]
                return
            plan = parse_plan(data)
            assert parse_plan(plan.text()) == plan
            if plan.path == "gpu":
                found = profile.envelope.binding(plan.bindingId or "")
                assert found is not None, plan.bindingId
                assert isinstance(found[1], (ExtendedResourceBinding, VramPluginBinding)), (
                    plan.bindingId
                )
                resource = found[1].resource.name
                assert set(plan.requests) == {resource}, (plan.requests, resource)
            assert status != 503, "a published, valid profile must not be unavailable"

        run()


# -- plan annotations --------------------------------------------------------------------------


plan_annotations = st.one_of(
    st.sampled_from(corpus.plan_texts()),
    st.sampled_from([p.wire() for p in corpus.plans()])
    .flatmap(lambda w: mutated(w, 3))
    .map(lambda w: json.dumps(w, separators=(",", ":"))),
    st.sampled_from(corpus.plan_texts()).map(str.encode).flatmap(garbled),
    st.text(max_size=40),
    st.sampled_from([p.wire() for p in corpus.plans()]).flatmap(lambda w: mutated(w, 2)),
)


def test_fuzz_plan_annotations() -> None:
    with recorded(Stats("plan-annotations")) as stats:

        @fuzz_settings(300)
        @given(plan_annotations)
        def run(annotation: Any) -> None:
            try:
                plan = parse_plan(annotation)
            except PlanError as exc:
                assert str(exc)
                stats.saw("refused")
                return
            stats.saw(f"plan-{plan.path}")
            assert parse_plan(plan.text()) == plan
            assert Plan.model_validate(plan.wire()) == plan
            if plan.path == "gpu":
                assert plan.limits == plan.requests and plan.bindingId and plan.arch
            if plan.path == "cpu":
                assert not plan.limits and plan.runtimeClassName is None

        run()


# -- settings ----------------------------------------------------------------------------------

KEY = Owner().public_key
Parse = Callable[[Sequence[str], Mapping[str, str]], Any]
SERVERS: dict[str, tuple[Parse, dict[str, str]]] = {
    "webhook": (
        webhook_settings,
        {"TMI_NAMESPACE": NAMESPACE, "TMI_TLS_CERT": "c", "TMI_TLS_KEY": "k"},
    ),
    "extender": (
        extender_settings,
        {
            "TMI_NAMESPACE": NAMESPACE,
            "TMI_TLS_CERT": "c",
            "TMI_TLS_KEY": "k",
            "TMI_OWNER_PUBLIC_KEY": KEY,
            "TMI_CLUSTER_BINDING_ID": CLUSTER,
        },
    ),
    "controller": (
        controller_settings,
        {
            "TMI_NAMESPACE": NAMESPACE,
            "TMI_OWNER_PUBLIC_KEY": KEY,
            "TMI_CLUSTER_BINDING_ID": CLUSTER,
            "TMI_IDENTITY": "me",
        },
    ),
}
# Whole-number settings, by variable, and where each server keeps the value.
WHOLE: dict[str, Callable[[Any], object]] = {
    "TMI_PORT": lambda s: s.port,
    "TMI_MINIMUM_BUNDLE_VERSION": lambda s: s.policy.minimum_bundle_version,
    "TMI_MAX_HEADER_BYTES": lambda s: s.limits.max_header_bytes,
    "TMI_WORKERS": lambda s: s.workers,
}
VARIABLES = [
    *WHOLE,
    "TMI_READ_TIMEOUT",
    "TMI_IDLE_TIMEOUT",
    "TMI_TLS_HANDSHAKE_TIMEOUT",
    "TMI_MAX_BODY_BYTES",
    "TMI_CERT_RELOAD_SECONDS",
    "TMI_SHUTDOWN_TIMEOUT",
    "TMI_DRAIN_SECONDS",
    "TMI_RESYNC_SECONDS",
    "TMI_WATCH_SECONDS",
    "TMI_LEASE_DURATION",
    "TMI_RENEW_DEADLINE",
    "TMI_RETRY_PERIOD",
    "TMI_API_TIMEOUT",
    "TMI_SCHEDULING_TIMEOUT_SECONDS",
    "TMI_ENABLED",
    "TMI_LEADER_ELECT",
    "TMI_PLAIN_HTTP",
    "TMI_LOG_LEVEL",
    "TMI_ENGINE_IMAGE_MAP",
    "TMI_OWNER_PUBLIC_KEY",
    "TMI_POD_NAMESPACES",
    "TMI_NAMESPACE",
]
values = st.one_of(
    st.sampled_from(["0", "1", "8", "10", "1.5", "80.9", "1e3", "-1", "nan", "inf", "", " "]),
    st.sampled_from(["true", "no", "DEBUG", "{}", '{"a":"b"}', "[1]", "*", "a,*", "2.0"]),
    st.integers(-10, 10**6).map(str),
    st.floats(allow_nan=True).map(str),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8),
    # Neither an argument nor an environment variable can hold a NUL byte (both are C strings
    # to the kernel), so no value here does.
).map(lambda text: text.replace("\x00", ""))


def _whole(text: str) -> int | None:
    """The whole number `text` spells, the way a person reads it (None: it spells none)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


@st.composite
def given_settings(draw: st.DrawFn) -> tuple[str, list[str], dict[str, str]]:
    server = draw(st.sampled_from(sorted(SERVERS)))
    env = dict(SERVERS[server][1])
    for variable in draw(st.lists(st.sampled_from(VARIABLES), max_size=4)):
        value = draw(values)
        if variable == "TMI_ENGINE_IMAGE_MAP" and not value.lstrip().startswith(("{", "[")):
            value = "./no-such-image-map-" + value  # never a path that exists
        env[variable] = value
    argv: list[str] = []
    for variable in draw(st.lists(st.sampled_from(VARIABLES), max_size=2)):
        value = draw(values)
        if variable == "TMI_ENGINE_IMAGE_MAP":
            continue
        argv += ["--" + variable.removeprefix("TMI_").lower().replace("_", "-"), value]
    return server, argv, env


def test_fuzz_server_settings() -> None:
    with recorded(Stats("server-settings")) as stats:

        @fuzz_settings(300)
        @given(given_settings())
        def run(case: tuple[str, list[str], dict[str, str]]) -> None:
            server, argv, env = case
            parse = SERVERS[server][0]
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    settings = parse(argv, env)
            except ConfigError as exc:
                assert str(exc)
                stats.saw("refused")
                return
            except SystemExit as exc:
                assert exc.code == 2
                stats.saw("usage")
                return
            stats.saw(f"{server}-accepted")
            flags = dict(zip(argv[::2], argv[1::2], strict=True))
            for variable, read in WHOLE.items():
                flag = "--" + variable.removeprefix("TMI_").lower().replace("_", "-")
                text = flags.get(flag, env.get(variable))
                if not text or not text.strip():
                    continue
                with contextlib.suppress(AttributeError):
                    value = read(settings)
                    assert value == _whole(text), (server, variable, text, value)

        run()
