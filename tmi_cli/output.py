"""How `tmi` writes what it prints: the document as JSON (or YAML, where the command takes
`-o`), to standard output or, with `--output-file`, to a file replaced in one rename.

Shell redirection (`tmi sign ... > cm.json`) creates the file before the command runs, so a
refused signing leaves an empty file where the last good one was; `--output-file` writes only
once the document exists, and never half of it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
import yaml

from policy_io.files import write_atomic

FORMATS = ("json", "yaml")


def add_output_arguments(parser: argparse.ArgumentParser, *, formats: bool = True) -> None:
    """`--output-file FILE`, and `-o json|yaml` when the command's output is data."""
    parser.add_argument(
        "--output-file",
        metavar="FILE",
        help="write the document to FILE (replaced in one rename, untouched on failure) "
        "instead of standard output",
    )
    if formats:
        parser.add_argument(
            "-o",
            "--output",
            choices=FORMATS,
            default="json",
            help="the output format (default json)",
        )


def render(document: Any, fmt: str = "json") -> bytes:
    if fmt == "yaml":
        return yaml.safe_dump(document, sort_keys=False).encode()
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


def emit(document: Any, args: argparse.Namespace | None = None, what: str = "output") -> None:
    """Print `document` as the command's arguments ask (`add_output_arguments`)."""
    fmt = getattr(args, "output", None) or "json"
    data = render(document, fmt)
    path = getattr(args, "output_file", None)
    if path:
        write_atomic(path, data, what)
        return
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


__all__ = ["FORMATS", "add_output_arguments", "emit", "render"]
