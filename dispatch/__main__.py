"""``python -m dispatch``: what this machine can route to, and why not.

python -m dispatch               # a table
python -m dispatch --json        # the same, machine-readable
python -m dispatch inspect FILE  # a saved program: regions, routes, sizes, versions, sources
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

from . import available_routes
from .config import Config
from .errors import ConfigError
from .inspect import device_usable


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["inspect"]:
        return inspect_file(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m dispatch", description="What this machine can route to, and why not."
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        config = Config.resolve()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    routes = available_routes()
    machine = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": device_usable(torch.device("cuda")),
        "mps": device_usable(torch.device("mps")),
        "forced_route": config.forced,
        "disabled": sorted(config.disabled),
        "strict": config.strict,
    }
    if args.json:
        print(json.dumps({"machine": machine, "routes": routes}, indent=2))
        return 0
    print("dispatch doctor")
    for key, value in machine.items():
        print(f"  {key:<13} {value}")
    print()
    width = max(len(n) for n in routes)
    print(f"  {'route':<{width}}  available  version         reason")
    for name, info in routes.items():
        mark = "yes" if info["available"] else "no"
        print(f"  {name:<{width}}  {mark:<9}  {info['version'] or '-':<14}  {info['reason'] or ''}")
    return 0


def inspect_file(argv: list[str]) -> int:
    """``python -m dispatch inspect FILE``: what a saved program holds (manifest only)."""
    from .archive import describe_file
    from .errors import DispatchError

    parser = argparse.ArgumentParser(
        prog="python -m dispatch inspect", description="What a saved dispatch program holds."
    )
    parser.add_argument("file", help="a file written by LoweredProgram.save")
    args = parser.parse_args(argv)
    try:
        print(describe_file(args.file))
    except (DispatchError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
