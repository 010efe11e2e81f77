"""`tmi render-dra`: the owner's DRA objects for a tenant, from its verified profile.

The DeviceClasses and claim templates of a profile's `dra` bindings are derived from the signed
facts (`inference_policy.trust.dra_claims`), so the owner renders them from the very bundle the
tenant's servers verify, never by hand. The default output is the chart's values
(`owner.dra.<namespace>`, pass it to the owner release with `-f`); `--objects` prints the
Kubernetes objects themselves for an install without the chart.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
import yaml

from inference_policy.trust.dra_claims import (
    claimed_bindings,
    device_class_object,
    owner_objects,
    published_templates,
    template_object,
)
from inference_policy.trust.signing import ProfileRefused, verify_configmap
from policy_io.files import read_json
from tmi_cli.policy_args import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    add_trust_arguments,
    now_from,
    verify_policy,
)


def cmd_render_dra(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    configmap = read_json(args.bundle, "bundle ConfigMap")
    policy = verify_policy(args, configmap)
    try:
        verified = verify_configmap(configmap, policy, now)
    except ProfileRefused as refusal:
        raise CommandError(
            f"{refusal.authorization_message} ({refusal.check})", EXIT_FAILED
        ) from None
    envelope = verified.envelope
    rendered: Any
    if args.objects:
        items = [device_class_object(b) for _, b in claimed_bindings(envelope)]
        items += [template_object(t, args.namespace) for t in published_templates(envelope)]
        rendered = {"apiVersion": "v1", "kind": "List", "items": items}
    else:
        rendered = {"owner": {"dra": {args.namespace: owner_objects(envelope)}}}
    if args.format == "yaml":
        sys.stdout.write(yaml.safe_dump(rendered, sort_keys=False))
    else:
        sys.stdout.buffer.write(orjson.dumps(rendered, option=orjson.OPT_INDENT_2) + b"\n")
    return EXIT_OK


def add_render_dra_parser(sub: Any) -> None:
    p = sub.add_parser(
        "render-dra",
        help="print the DeviceClasses and claim templates of a profile's dra bindings",
    )
    p.add_argument("--bundle", required=True, metavar="CONFIGMAP_FILE", help="signed profile")
    add_trust_arguments(p, required=True)
    p.add_argument(
        "--objects",
        action="store_true",
        help="print the Kubernetes objects (a List) instead of the chart's owner.dra values",
    )
    p.add_argument(
        "--format", choices=("json", "yaml"), default="yaml", help="output format (yaml)"
    )
    p.add_argument("--now", metavar="T", help="check the profile's window at T (RFC 3339)")
    p.set_defaults(func=cmd_render_dra)
