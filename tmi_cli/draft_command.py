"""`tmi draft`: a profile envelope drafted from `tmi detect --host` outputs, one per GPU node,
or from the Nodes' GPU Feature Discovery labels, by the seed's rules
(`inference_policy.tools.draft`), for the owner to review and sign.

The draft is checked against the profile schema before it is printed, so what the owner signs
is only what they change; the notes (stderr) name the nodes and models it drew on and what it
left to them. The keyId comes from the owner's key (`--private-key`) or is given.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from inference_policy.tools.draft import DraftError, draft_envelope, observed, observed_node
from inference_policy.trust.profile import ProfileSchemaError, parse_envelope
from inference_policy.trust.signing import public_identity
from policy_io.catalog import packaged_catalog
from policy_io.files import read_json
from tmi_cli.capacity_command import list_from_api
from tmi_cli.output import add_output_arguments, emit
from tmi_cli.policy_args import EXIT_OK, EXIT_USAGE, CommandError, now_from, positive_int
from tmi_cli.profile_commands import load_private_key

Subparsers = Any


def cmd_draft(args: argparse.Namespace) -> int:
    if (args.private_key is None) == (args.key_id is None):
        raise CommandError("give the owner's key as --private-key FILE or --key-id ID", EXIT_USAGE)
    key_id = (
        public_identity(load_private_key(args.private_key))["keyId"]
        if args.private_key
        else args.key_id
    )
    try:
        if args.from_detect:
            nodes = [observed(read_json(path, "detect output"), path) for path in args.from_detect]
        else:
            listed = (
                read_json(args.from_nodes, "Nodes")
                if args.from_nodes
                else list_from_api(args.kubeconfig, "Nodes")
            )
            items = listed.get("items") if isinstance(listed, dict) else listed
            if not isinstance(items, list):
                raise CommandError("the Nodes must be a NodeList or a list of Nodes")
            nodes = [n for n in (observed_node(item) for item in items) if n is not None]
        envelope, notes = draft_envelope(
            nodes,
            packaged_catalog(),
            key_id=key_id,
            cluster_binding_id=args.cluster_binding_id,
            namespace=args.namespace,
            now=now_from(args.now),
            days=args.days,
        )
    except DraftError as exc:
        raise CommandError(str(exc)) from None
    try:
        parse_envelope(envelope)
    except ProfileSchemaError as exc:
        raise CommandError(f"the draft breaks the profile schema: {exc}") from None
    emit(envelope, args, "draft envelope")
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    return EXIT_OK


def add_draft_parser(sub: Subparsers) -> None:
    p = sub.add_parser("draft", help="draft a profile envelope from tmi detect --host outputs")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-detect",
        nargs="+",
        metavar="FILE",
        help="`tmi detect --host` output of each GPU node (JSON or YAML): measured facts",
    )
    source.add_argument(
        "--from-nodes",
        metavar="FILE",
        help="`kubectl get nodes -o json`: GPU Feature Discovery's labels and allocatable",
    )
    source.add_argument(
        "--from-api",
        action="store_true",
        help="the same, read as the owner through the API server",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="with --from-api (else $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument("--cluster-binding-id", required=True, metavar="ID", help="this cluster's id")
    p.add_argument("--namespace", required=True, metavar="NS", help="the tenant namespace")
    p.add_argument("--private-key", metavar="FILE", help="the owner's key: its keyId is used")
    p.add_argument("--key-id", metavar="ID", help="the owner's keyId, as tmi pubkey prints it")
    p.add_argument(
        "--days", type=positive_int, default=90, metavar="N", help="the window's length (90)"
    )
    p.add_argument("--now", metavar="T", help="the window starts at T (default now)")
    add_output_arguments(p)
    p.set_defaults(func=cmd_draft)


__all__ = ["add_draft_parser"]
