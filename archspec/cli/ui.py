"""`archspec ui`: serve the registry read-only in a browser (the `ui` extra: Starlette on uvicorn)."""

from __future__ import annotations

import ipaddress

import click

from archspec.cli.options import registry_option
from archspec.console import echo
from archspec.errors import UserError, printable

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@registry_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback exposes the registry to the network: the app has no "
                   "authentication.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="Port to listen on.")
@click.option("--check", is_flag=True, help="Open the registry and build the app, print the URL, and exit.")
def ui_cmd(registry_url: str | None, host: str, port: int, check: bool) -> None:
    """Browse the registry: runs (filters as `runs list --where`), curves, a run's spec, accounting and generated
    code, runs side by side, and each sweep's report. Read-only: nothing is written to the registry."""
    if not host or not (host.isascii() and host.isprintable()) or any(c in host for c in "/ \\@?#"):
        raise UserError(f"--host: {printable(repr(host), 80)} is not an address or host name")
    try:
        import uvicorn

        from archspec.ui.app import create_app
    except ImportError as e:
        raise UserError(f"archspec ui needs the ui extra ({e.name} is missing): pip install 'archspec[ui]'") from None
    from archspec.ui.app import served_hosts

    # Only the names that reach the address bound answer (DNS rebinding): loopback's own names for loopback, the
    # address itself otherwise; bound to all of them (0.0.0.0), whatever name the machine is reached by.
    app = create_app(registry_url, served_hosts(host))
    registry = app.state.archspec.registry
    registry.runs(limit=1)  # the registry opens (a schema this code cannot read is refused here, with its command)
    _can_bind(host, port)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
    if not _loopback(host):
        echo(f"warning: serving on {host}, beyond this machine: anyone who can reach it reads the registry "
             "(the app has no authentication)", err=True)
    echo(f"archspec ui: {registry.url} at {url}", err=True)
    if check:
        return
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _can_bind(host: str, port: int) -> None:
    """A port that is taken or an address that is not this machine's: exit 2 naming them, before uvicorn starts."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
    except (OSError, UnicodeError) as e:  # taken, not this machine's, or a name that does not resolve
        raise UserError(f"--host {host} --port {port}: cannot listen there: {getattr(e, 'strerror', None) or e}"
                        ) from None
