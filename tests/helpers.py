"""Small helpers shared by test modules (a module of its own: several conftest.py files exist)."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The seed's required SlimeRunner fields, valid as they are (recipe and rendering tests start here).
SEED_RECIPE = {
    "exp_id": "gsm8k-3b-smoke",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
    "s3_bucket": "my-rollouts",
    "model_dir": "/models/Qwen2.5-3B-Instruct",
    "data_path": "/data/gsm8k.jsonl",
    "model_type": "qwen2.5-3B",
}
