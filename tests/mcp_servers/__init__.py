"""MCP servers the tests start, written with the official SDK's own server API."""
