"""A stand-in slime (and Megatron) whose argument parsing has slime's structure at a74ae3a0, for
the flag catalog tests: `slime.utils.arguments.parse_args` runs a pre-parse (add_help=False), then
a separate SGLang + router parser (add_help=False, parse_known_args), then the Megatron + slime
parser (the only one with add_help=True, ignore_unknown_args), then checks that fail on defaults.
`train.py --help` therefore lists none of the --sglang-* / --router-* / pre-parse options, exactly
as with the real slime. Written as files (not imported from here) so the target interpreter
imports them like a checkout.
"""

from __future__ import annotations

from pathlib import Path

PRE = ["--train-backend", "--debug-rollout-only", "--debug-train-only"]
SGLANG = ["--sglang-mem-fraction-static", "--sglang-router-ip", "--sglang-server-concurrency", "--router-policy"]
MEGATRON = ["--lr", "--tensor-model-parallel-size", "--hidden-size", "--seq-length", "--help"]
SLIME = ["--hf-checkpoint", "--num-rollout", "--rollout-batch-size", "--colocate", "--train-env-vars"]

SLIME_ARGUMENTS = '''import argparse

from slime.backends.sglang_utils.arguments import sglang_parse_args


def get_slime_extra_args_provider():
    def add_slime_arguments(parser):
        parser.add_argument("--hf-checkpoint", type=str, default=None)
        parser.add_argument("--num-rollout", type=int, default=None)
        parser.add_argument("--rollout-batch-size", type=int, required=True)
        parser.add_argument("--colocate", action="store_true")
        parser.add_argument("--train-env-vars", type=str, default="{}")
        return parser

    return add_slime_arguments


def _pre_parse_mode():
    temp_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    temp_parser.add_argument("--train-backend", type=str, choices=["megatron"], default="megatron")
    temp_parser.add_argument("--debug-rollout-only", action="store_true", default=False)
    temp_parser.add_argument("--debug-train-only", action="store_true", default=False)
    temp_args, _ = temp_parser.parse_known_args()
    return temp_args


def slime_validate_args(args):
    assert args.hf_checkpoint is not None, "--hf-checkpoint is required"


def parse_args(add_custom_arguments=None):
    pre = _pre_parse_mode()
    sglang_ns = None if pre.debug_train_only else sglang_parse_args()
    from slime.backends.megatron_utils.arguments import megatron_parse_args

    args = megatron_parse_args(extra_args_provider=get_slime_extra_args_provider())
    for key, value in vars(pre).items():
        setattr(args, key, value)
    for key, value in vars(sglang_ns or argparse.Namespace()).items():
        setattr(args, key, value)
    slime_validate_args(args)
    return args
'''

SGLANG_ARGUMENTS = '''import argparse


def add_sglang_arguments(parser):
    parser.add_argument("--sglang-router-ip", type=str, default=None)
    parser.add_argument("--router-policy", type=str, default="cache_aware")
    parser.add_argument("--sglang-server-concurrency", type=int, default=512)
    parser.add_argument("--sglang-mem-fraction-static", type=float, default=None)
    return parser


def sglang_parse_args():
    parser = argparse.ArgumentParser(add_help=False)
    add_sglang_arguments(parser)
    args, _ = parser.parse_known_args()
    return args
'''

MEGATRON_BRIDGE = '''from megatron.training.arguments import parse_args as _megatron_parse_args


def megatron_parse_args(extra_args_provider, skip_hf_validate=False):
    return _megatron_parse_args(extra_args_provider=extra_args_provider, ignore_unknown_args=True)
'''

# Without a Megatron checkout (the small test stack has none) slime's bridge builds the same kind of
# parser itself: the structure the catalog must see is the same.
INLINE_MEGATRON = '''import argparse


def megatron_parse_args(extra_args_provider, skip_hf_validate=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments (stand-in)", allow_abbrev=False)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=None)
    parser.add_argument("--seq-length", type=int, default=None)
    parser = extra_args_provider(parser)
    args, _ = parser.parse_known_args()
    return args
'''

MEGATRON_ARGUMENTS = '''import argparse


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments (stand-in)", allow_abbrev=False)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=None)
    parser.add_argument("--seq-length", type=int, default=None)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    if ignore_unknown_args:
        args, _ = parser.parse_known_args()
    else:
        args = parser.parse_args()
    return args
'''

TRAIN = '''from slime.utils.arguments import parse_args

if __name__ == "__main__":
    print(parse_args())
'''


def slime_files(inline_megatron: bool) -> dict[str, str]:
    """The files of the stand-in slime checkout (relative path -> text)."""
    return {
        "train.py": TRAIN,
        "slime/__init__.py": "",
        "slime/utils/__init__.py": "",
        "slime/utils/arguments.py": SLIME_ARGUMENTS,
        "slime/backends/__init__.py": "",
        "slime/backends/sglang_utils/__init__.py": "",
        "slime/backends/sglang_utils/arguments.py": SGLANG_ARGUMENTS,
        "slime/backends/megatron_utils/__init__.py": "",
        "slime/backends/megatron_utils/arguments.py": INLINE_MEGATRON if inline_megatron else MEGATRON_BRIDGE,
    }


MEGATRON_FILES = {"megatron/__init__.py": "", "megatron/training/__init__.py": "",
                  "megatron/training/arguments.py": MEGATRON_ARGUMENTS}


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
