"""``basis-lab-dashboard``: start the dashboard (``app/main.py``) from wherever the package is installed.

It runs ``python -m streamlit run <this package>/main.py`` on 127.0.0.1, headless, on
``--port`` (default: ``$PORT``, else 8501: the port ``make run PORT=…`` takes), with no usage
statistics sent, no "Deploy" (to Streamlit's cloud) in the header and no full garbage
collection after each script run (as the repository's
``.streamlit/config.toml`` says, which Streamlit reads only when started from the repository
root; the flags hold from any folder). The process
becomes Streamlit (``os.execv``), so Ctrl-C and signals reach the server itself.
``--print-command`` prints the command instead of running it. Imports no Streamlit.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

DEFAULT_PORT = 8501
MAIN = Path(__file__).resolve().with_name("main.py")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; give an integer in 1..65535, e.g. 8600")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="basis-lab-dashboard", description="Start the BASIS Lab dashboard (Streamlit) in the foreground.")
    parser.add_argument("--port", type=_port, default=os.environ.get("PORT", str(DEFAULT_PORT)),
                        help=f"the port to listen on (default: $PORT, else {DEFAULT_PORT})")
    parser.add_argument("--address", default="127.0.0.1",
                        help="the address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--print-command", action="store_true", help="print the Streamlit command and exit")
    return parser


def command(port: int, address: str) -> list[str]:
    """The Streamlit command that serves the dashboard on ``address:port``."""
    return [sys.executable, "-m", "streamlit", "run", str(MAIN), "--server.port", str(port),
            "--server.address", address, "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "viewer", "--runner.postScriptGC", "false"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script: parse ``argv`` (default: the command line), then print or become the server."""
    args = build_parser().parse_args(argv)
    cmd = command(args.port, args.address)
    if args.print_command:
        print(shlex.join(cmd))
        return 0
    os.execv(sys.executable, cmd)  # does not return; glibc's default malloc (engine.training.allocator says why)


if __name__ == "__main__":
    sys.exit(main())
