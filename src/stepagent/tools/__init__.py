"""Tools: the tool port and toolset, the built-in tools, and Python function, MCP and RAP tools."""
