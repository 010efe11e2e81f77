"""Lets `python -m tmi_cli` run the owner CLI where the console script is not on PATH."""

from tmi_cli.main import main

raise SystemExit(main())
