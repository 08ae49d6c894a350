"""Names vulture cannot see being used (it reads this file as code that uses them).

Only what a framework or a user calls: everything else unused is dead code, to delete. The checks
(`@check`), pydantic validators and invoke tasks are left out by --ignore-decorators in .ci/run.
"""

_ = object()

# The public Python API (`from slimeforge import SlimeRunner`; README's "Python API").
_.__getattr__  # slimeforge/__init__.py: the lazy `SlimeRunner` export
_.from_yaml  # SlimeRunner.from_yaml
_.to_yaml  # SlimeRunner.to_yaml
_.train  # SlimeRunner.train
_.__signature__  # read by inspect.signature() and help()
_.launch  # run/launch.py launch(recipe, stack, **options): a parsed recipe on `invoke run`'s path (docs/run.md's Python API)

# pydantic reads these class attributes.
_.model_config  # slimeforge/schema.py: Model's settings
_.schema_version  # slimeforge/image/stack.py: a stack file's schema version (validated, not read back)

# Record fields: parsed whole from the node agent's nvidia-smi query and slime's facts file.
_.uuid  # preflight/host.py Gpu
_.memory_mib  # preflight/host.py Gpu
_.renderable_flags  # run/slime_facts.py SlimeFacts (tests/unit/test_render.py checks the rendered flags against it)

# Set on a library object, read by that library.
_.hook_mode  # scripts/kernel_check.py: torch_memory_saver.hook_mode = "torch" (its setter picks the hook)

# io.RawIOBase's protocol, called by io.BufferedReader (image/layerpush.py _ChunkReader: the `docker save` stream).
_.readable
_.readinto
