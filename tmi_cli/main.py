"""`tmi`, the cluster owner's tool: keys, GPU detection, signing, verification, catalogs and plans.

Every command prints JSON (the catalog prints TSV) on stdout and errors on stderr as
`error: ...`. `tmi plan` decides through the same planner and the same state object the servers
use, so its answer is the servers' answer. Exit status: 0 success, 1 a refusal or failure (4xx
for plans), 2 a usage error, 3 a plan refused with a 5xx.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

from inference_policy.placing.schedconfig import (
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SCHEDULER_NAMESPACE,
    SchedulerConfigError,
    render_scheduler_config,
)
from inference_policy.planning.catalog import CatalogError
from inference_policy.planning.recipes import RecipeCatalogError, render_catalog
from inference_policy.tools.detection import accelerator_block
from inference_policy.tools.host_facts import dra_devices, host_report
from inference_policy.trust.signing import ProfileRefused, verify_configmap
from policy_io.catalog import packaged_catalog
from policy_io.files import InputError, read_bytes, read_json
from tmi_cli.capacity_command import add_capacity_parser
from tmi_cli.cleanup_command import add_cleanup_parser
from tmi_cli.detect import TOOLKIT_CONFIG, DetectionError, detect_accelerator, detect_toolkit
from tmi_cli.doctor_command import add_doctor_parser
from tmi_cli.draft_command import add_draft_parser
from tmi_cli.evidence_command import add_evidence_parser
from tmi_cli.host_probe import Capture, cuda_driver, host_gpus, smi_of, this_node
from tmi_cli.nvidia_smi import probe_nvidia_smi, run_command
from tmi_cli.output import FORMATS, add_output_arguments, emit
from tmi_cli.ping_command import add_ping_parser
from tmi_cli.policy_args import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    add_policy_arguments,
    add_trust_arguments,
    now_from,
    policy_snapshot,
    positive_int,
    verify_policy,
)
from tmi_cli.profile_commands import add_profile_parsers
from tmi_cli.render_dra_command import add_render_dra_parser
from tmi_cli.revision_commands import add_revision_parsers


class _StoreOnce(argparse._StoreAction):
    """A flag that takes one value refuses a second: `--request a --request b` would otherwise
    plan `b` alone and say nothing."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen: set[str] = namespace.__dict__.setdefault("_given", set())
        if option_string is not None and self.dest in seen:
            parser.error(f"{option_string} is given twice; it takes one value")
        seen.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def cmd_detect(args: argparse.Namespace) -> int:
    try:
        capture = Capture(args.from_dir) if args.from_dir else None
        if capture is not None:
            # A recording has no NVML to ask: nvidia-smi's answers are what it holds.
            host = probe_nvidia_smi(capture)
            block = accelerator_block(host.gpus, host.cuda_driver_version, host.peer_paths)
        else:
            block = detect_accelerator()
        document: dict[str, Any] = dict(block)
        if args.container_toolkit:
            # The accelerator block stays as the seed prints it; the report sits beside it.
            document["containerToolkit"] = detect_toolkit(args.toolkit_config)
        if args.host:
            runner = smi_of(capture if capture is not None else run_command)
            gpus = host_gpus(runner)
            node = args.node or (capture.node if capture is not None else None) or this_node()
            source = f"capture {args.from_dir}" if capture is not None else "nvidia-smi"
            machine = capture.machine if capture is not None else platform.machine()
            document["host"] = host_report(node, gpus, cuda_driver(runner), source, machine)
            document["dra"] = {"devices": dra_devices(gpus)}
    except DetectionError as exc:
        raise CommandError(str(exc)) from None
    emit(document, args)
    return EXIT_OK


def cmd_render_scheduler_config(args: argparse.Namespace) -> int:
    """The owner's scheduler configuration. Nothing in it depends on the profile; given one
    (`--bundle`), it refuses to render for a profile the servers would refuse."""
    if args.bundle:
        if not args.owner_public_key or not args.cluster_binding_id or not args.namespace:
            raise CommandError(
                "--bundle needs --owner-public-key, --cluster-binding-id and --namespace to "
                "verify it",
                EXIT_USAGE,
            )
        now = now_from(args.now)
        configmap = read_json(args.bundle, "bundle ConfigMap")
        policy = verify_policy(args, configmap)
        try:
            verify_configmap(configmap, policy, now)
        except ProfileRefused as refusal:
            raise CommandError(
                f"{refusal.authorization_message} ({refusal.check})", EXIT_FAILED
            ) from None
    ca_pem = read_bytes(args.ca_file, "CA file") if args.ca_file else None
    try:
        rendered = render_scheduler_config(
            extender_url=args.extender_url,
            ca_pem=ca_pem,
            scheduler_name=args.scheduler_name,
            scheduler_namespace=args.scheduler_namespace,
            weight=args.weight,
            http_timeout=args.http_timeout,
            server_name=args.extender_server_name,
        )
    except SchedulerConfigError as exc:
        where = f" ({args.ca_file})" if args.ca_file and "CA file" in str(exc) else ""
        raise CommandError(f"{exc}{where}", EXIT_USAGE) from None
    emit(rendered, args, "scheduler configuration")
    return EXIT_OK


def cmd_render_catalog(args: argparse.Namespace) -> int:
    document = read_json(args.catalog, "recipe catalog")
    try:
        rendered = render_catalog(document, args.namespace, args.capability)
    except RecipeCatalogError as exc:
        raise CommandError(str(exc)) from None
    emit(rendered.configmap, args, "recipe catalog ConfigMap")
    return EXIT_OK


def cmd_catalog(args: argparse.Namespace) -> int:
    rows = packaged_catalog().rows()
    sys.stdout.write("".join("\t".join(row) + "\n" for row in rows))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    request = read_json(args.request, "deployment request")
    decision = policy_snapshot(args, now, disabled=args.disabled).decide(request, now)
    emit(decision.body, args)
    if decision.allowed:
        return EXIT_OK
    return EXIT_UNAVAILABLE if decision.status >= 500 else EXIT_FAILED


def cmd_completion(args: argparse.Namespace) -> int:
    """The shell's completion script for every command and flag, generated from this parser
    (shtab), so it cannot fall behind the commands."""
    import shtab  # noqa: PLC0415 - only this command needs it

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


def _version() -> str:
    try:
        return metadata.version("tmi")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tmi", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"tmi {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("detect", help="print this host's accelerator block")
    p.add_argument(
        "--container-toolkit",
        action="store_true",
        help="also report whether the NVIDIA Container Toolkit lets an unprivileged "
        "container's own NVIDIA_VISIBLE_DEVICES select GPUs (the image-environment path)",
    )
    p.add_argument(
        "--toolkit-config",
        default=TOOLKIT_CONFIG,
        help=f"the toolkit's config.toml (default {TOOLKIT_CONFIG})",
    )
    p.add_argument(
        "--host",
        action="store_true",
        help="also report the host (node, each GPU's model, UUID, memory total and reserved, "
        "MIG mode and profiles) and, for a dra binding, each kind of GPU as NVIDIA's DRA "
        "driver names it",
    )
    p.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="answer from a recorded capture (tools/gpu-capture.sh DIR) instead of this host",
    )
    p.add_argument("--node", metavar="NAME", help="the node's name (default: NODE_NAME, hostname)")
    add_output_arguments(p)
    p.set_defaults(func=cmd_detect)

    add_evidence_parser(sub)
    add_capacity_parser(sub)
    add_cleanup_parser(sub)
    add_render_dra_parser(sub)
    add_ping_parser(sub)
    add_revision_parsers(sub)
    add_draft_parser(sub)
    add_doctor_parser(sub)

    add_profile_parsers(sub)

    p = sub.add_parser("render-catalog", help="render a recipe catalog as an immutable ConfigMap")
    p.add_argument(
        "--catalog", required=True, metavar="FILE", help="the recipe catalog (JSON or YAML)"
    )
    p.add_argument("--namespace", required=True, metavar="NS", help="the tenant namespace")
    p.add_argument(
        "--capability", required=True, choices=("gpu", "cpu"), help="which catalog it is"
    )
    add_output_arguments(p)
    p.set_defaults(func=cmd_render_catalog)

    p = sub.add_parser(
        "render-scheduler-config",
        help="print the KubeSchedulerConfiguration of the owner's scheduler for a profile",
    )
    p.add_argument(
        "--extender-url",
        required=True,
        metavar="URL",
        help="where the scheduler calls the extender (https://...)",
    )
    p.add_argument("--ca-file", metavar="F", help="CA of the extender's serving certificate")
    p.add_argument(
        "--extender-server-name",
        metavar="NAME",
        help="the name the extender's certificate is checked against when --extender-url "
        "names an address (a ClusterIP, for a scheduler without cluster DNS)",
    )
    p.add_argument(
        "--scheduler-name",
        default=DEFAULT_SCHEDULER_NAME,
        metavar="NAME",
        help=f"the second scheduler's name (default {DEFAULT_SCHEDULER_NAME})",
    )
    p.add_argument(
        "--scheduler-namespace",
        default=DEFAULT_SCHEDULER_NAMESPACE,
        metavar="NS",
        help=f"its leader-election namespace (default {DEFAULT_SCHEDULER_NAMESPACE})",
    )
    p.add_argument(
        "--weight", type=positive_int, default=5, metavar="N", help="prioritize weight (1-100)"
    )
    p.add_argument(
        "--http-timeout", default="5s", metavar="DURATION", help="per extender call (5s)"
    )
    p.add_argument(
        "--bundle",
        metavar="CONFIGMAP_FILE",
        help="optionally, a signed profile to verify first (with the three flags below)",
    )
    add_trust_arguments(p, when="with --bundle")
    p.add_argument("--now", metavar="T", help="with --bundle: check its window at T")
    add_output_arguments(p)
    # Kept for the scripts that spelled it so: the same as -o.
    p.add_argument("--format", dest="output", choices=FORMATS, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_render_scheduler_config)

    p = sub.add_parser("completion", help="print the shell completion script")
    p.add_argument(
        "shell",
        choices=("bash", "zsh", "tcsh"),
        help="e.g. source <(tmi completion bash), or write it to your completions directory",
    )
    p.set_defaults(func=cmd_completion)

    p = sub.add_parser("catalog", help="print the engine catalog's images as TSV")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("plan", help="plan a deployment request exactly as the servers would")
    add_policy_arguments(p)
    p.add_argument(
        "--request", required=True, metavar="FILE", help="the deployment request (JSON or YAML)"
    )
    p.add_argument("--disabled", action="store_true", help="tenant-mode inference off")
    add_output_arguments(p)
    p.set_defaults(func=cmd_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except (CommandError, InputError, CatalogError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.status if isinstance(exc, CommandError) else EXIT_FAILED
    return status


if __name__ == "__main__":
    raise SystemExit(main())
