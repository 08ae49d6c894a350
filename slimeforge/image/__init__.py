"""The image pipelines: a stack (images/<flavor>.yaml) in; a lock, an image, an install script, a
published reference out. One folder per pipeline, by what flows through it (the layers, in
pyproject's import-linter contracts, run downwards: builder -> wheels -> publish -> lock -> remote):

    lock/      a stack's pins resolved once into images/locks/pylock.<flavor>.toml, checked, completed
    builder/   stack + lock -> the Dockerfile -> an image built with BuildKit, smoke-tested, reported;
               or install.sh for a bare-metal host
    wheels/    the compiled-wheel store: each compiled step's wheels by key, locally or in a registry
    publish/   a built image pushed to a registry or ECR, verified by digest, recorded
    remote/    registries over the network: the v2 API, ECR, stored logins, which host is reached how

and what all of them read, flat here: stack (the stack and its plan), steps (the plan as step
library calls), sources (--source), patches (from slime's pinned tree), imageref (the reference
grammar), dockerapi (the one Docker Engine client).
"""
