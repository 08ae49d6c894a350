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
# run/launch.py launch(recipe, stack, **options): a parsed recipe on `invoke run`'s path (docs/run.md's Python API)
_.launch

# pydantic reads these class attributes.
_.model_config  # slimeforge/schema.py: Model's settings
_.schema_version  # slimeforge/image/stack.py: a stack file's schema version (validated, not read back)

# Record fields: parsed whole from the node agent's nvidia-smi query and slime's facts file.
_.uuid  # preflight/host.py Gpu
_.memory_mib  # preflight/host.py Gpu
_.renderable_flags  # run/slime_facts.py SlimeFacts (tests/unit/test_render.py checks the rendered flags against it)

# TypedDict keys of documents that json.dumps or yaml writes, or that a reader narrows to (read by key, by
# the library or the user's own tools): slimeforge/run and slimeforge/cluster.
_.is_head_node, _.resources_total  # cluster/agent.py RayNode
_.ray_process, _.gpus_seen, _.gpus_ray  # cluster/statustable.py StatusRow
# run/flags.py AgentCoreConfig
_.backend, _.agentcore_runtime_arn, _.rollout_output_s3, _.experiment_name, _.max_pool_connections
_.rollout_session_backend, _.max_rollout_time, _.tps_limit  # run/flags.py AgentCoreConfig
_.train_args  # run/targets/base.py PlanDoc
_.head_pid  # run/targets/jobs.py JobStatusDoc
_.working_dir, _.env_vars  # run/targets/jobsapi.py RuntimeEnv
_.enroot_said, _.squashfs, _.head_only  # run/targets/slurm.py EnrootImage, NodePath

# Set on a library object, read by that library.
_.hook_mode  # scripts/kernel_check.py: torch_memory_saver.hook_mode = "torch" (its setter picks the hook)

# io.RawIOBase's protocol, called by io.BufferedReader (image/publish/layerpush.py _ChunkReader: the `docker save`
# stream).
_.readable
_.readinto

# Ray's ports: pydantic fields read by key (rayports.py reads RaySettings.model_dump() by its keys).
_.client_port
_.autoscaler_metrics_port
_.dashboard_metrics_port
_.node_manager_port
_.object_manager_port
_.runtime_env_agent_port
_.dashboard_agent_grpc_port
_.dashboard_agent_listen_port
_.metrics_export_port
_.min_worker_port
_.max_worker_port
_.firewall_table  # rayports.py: docs/cluster.md's table (tests/unit/test_ray_ports.py compares the page with it)
_.RAY_AGENT_PORT  # run/targets/slurm.py: the port tests/integration/slurm holds busy on a node

# Kept for the tests, which prove processes with them; the code does it through scripts/procproof.py.
_.pid_alive  # proc.py: the one liveness test of tests/launch_support.py, test_launch and the cluster lab tests
# run/ownership.py: the start time of /proc/PID/stat as ownership's unit tests read it (procproof.parse_stat)
_.stat_start_time

# urllib's OpenerDirector calls a handler's `<scheme>_open` by name (image/remote/registry.py's deadline handler).
_.http_open
_.https_open

# The text stream protocol (slimeforge/cli.py AsTyped stands in for sys.stdout and sys.stderr: whoever writes lines
# calls it).
_.writelines

# TypedDict keys, read by subscript (`step["slice"]`, `summary["named_by_stack"]`) or by a template.
_.slice  # image/builder/install.py ScriptStep (install.sh.j2)
_.together  # ScriptStep
_.together_last  # ScriptStep
_.slice_path  # ScriptStep
_.in_venv  # ScriptStep
_.after_all  # ScriptStep
_.named_by_stack  # image/lock/lockcheck.py LockSummary

# The compile pool's rule in Python (templates/steps.sh sf_jobserver_plan is the one the install runs):
# benchmarks/compile_bench.py builds its `jobserver` set with it on a GPU host; tests hold the two together.
_.jobserver_plan
# The compile queue's rule in Python (templates/steps.sh sf_queue_plan is the one the install runs):
# benchmarks/compile_bench.py's queue set and the tests that hold the two rules to each other call it.
_.queue_plan
_.ninja_takes_jobserver

# Python's import machinery reads it: scripts/smoke_imports.py --warm writes the .pyc of what it compiles.
_.dont_write_bytecode
