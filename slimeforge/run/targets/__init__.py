"""Launch targets: how a run reaches its hosts (base.py: the interface and the plan)."""
