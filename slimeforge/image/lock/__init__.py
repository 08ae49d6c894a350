"""The lock: a stack's pins resolved once, for its target, into images/locks/pylock.<flavor>.toml.

In: a Stack (every step's pins, the overrides, the indexes, the target) and facts no index holds
(the base image's digest, asked of its registry through remote/; the router wheel's sha256; the
patch files' sha256). Out: the lock file written (uvlock: `invoke lock`), read back and validated
(lockfile: LockFile), checked against its stack (lockcheck: every problem, offline) and completed
(lockfacts: `--complete`, the facts a build or install fills first); remedies words the one fix
for each fact a lock can lack.
"""
