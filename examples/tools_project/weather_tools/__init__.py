"""Example stepagent tools, packaged as their own project (see examples/tools_project/README.md)."""
