"""slimeforge: reproducible images, installs and launches for slime RL training with AgentCore rollouts."""

__version__ = "0.1.0"

__all__ = ["SlimeRunner", "__version__"]


def __getattr__(name: str):
    # Lazy, so `import slimeforge` stays cheap for the CLI.
    if name == "SlimeRunner":
        from .api import SlimeRunner

        return SlimeRunner
    raise AttributeError(name)
