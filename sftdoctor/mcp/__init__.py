"""`sftdoctor mcp`: check, explain, plan, diff and report as read-only tools of a Model Context Protocol server
on stdio, for coding agents. Each tool answers the JSON its command prints with --json, built by the same
function; nothing is written outside the server's own temporary folder. Needs the SDK: pip install
'sftdoctor[mcp]' (mcp >= 2.3, imported only by `sftdoctor mcp`)."""
