"""`sftdoctor mcp`: the SDK's presence checked first (it is an extra), then the server on stdio."""

from __future__ import annotations

from sftdoctor.errors import InputError

SDK = "mcp>=2.3,<3"  # pyproject's [mcp] extra: MCPServer and the snake_case types came with mcp 2.x


def main() -> int:
    """0 when the client closed stdin; 130 or 143 on Ctrl-C or SIGTERM. Without the SDK (or with mcp 1.x,
    where MCPServer was FastMCP) raises InputError: one line naming the extra to install."""
    try:
        from sftdoctor.mcp.server import serve
    except ImportError as exc:
        if not (exc.name or "").startswith(("mcp", "pydantic")):
            raise
        raise InputError("mcp", f"needs the MCP SDK ({SDK}){installed()}: pip install 'sftdoctor[mcp]'") from None
    return serve()


def installed() -> str:
    """ ", found mcp 1.30.0" where an mcp package of another major is installed; "" where none is."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f", found mcp {version('mcp')}"
    except PackageNotFoundError:
        return ""
