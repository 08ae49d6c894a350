"""A flashinfer-cubin of a few files, laid out as the real 0.6.12 wheel is (cubins/<40 hex>/<family>/...),
each cubin with a CUDA ELF header of the layout the real ones have (ABI version 8, the SM in e_flags'
second byte), for the prune's tests: unit (an installed tree) and heavy (a wheel sf_pip_step installs)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

COMMIT = "158f6fa11ef139a098cfddcdddce73ca99d164ad"
DIST, VERSION = "flashinfer-cubin", "0.6.12"


def cubin(sm: int, abi: int = 8, size: int = 4096) -> bytes:
    """A CUDA ELF64 of `size` bytes whose header says `sm` (as nvcc 12.8+ writes it: ABI version 8)."""
    head = bytearray(64)
    head[:9] = b"\x7fELF" + bytes([2, 1, 1, 0x41, abi])
    head[16:18] = (2).to_bytes(2, "little")  # ET_EXEC
    head[18:20] = (190).to_bytes(2, "little")  # EM_CUDA
    head[48:52] = (0x06000002 | sm << 8).to_bytes(4, "little")
    return bytes(head) + bytes(size - 64)


# path under the site directory -> content; what the prune for ["9.0"] takes: the Blackwell cubins
FILES: dict[str, bytes] = {
    "flashinfer_cubin/__init__.py": b"CUBIN_DIR = None\n",
    f"flashinfer_cubin/cubins/{COMMIT}/fmha/trtllm-gen/fmhaSm100fKernel_QkvBfloat16OBfloat16H64.cubin": cubin(100),
    f"flashinfer_cubin/cubins/{COMMIT}/fmha/trtllm-gen/fmhaSm103aKernel_QkvBfloat16OBfloat16H64.cubin": cubin(103,
                                                                                                             size=8192),
    f"flashinfer_cubin/cubins/{COMMIT}/deep-gemm/kernel.fp8_m_grouped_gemm.007404769193.cubin": cubin(100),
    f"flashinfer_cubin/cubins/{COMMIT}/gemm/Gemm_Bfloat16_t128x8x128_sm90a.cubin": cubin(90),  # Hopper: kept
    f"flashinfer_cubin/cubins/{COMMIT}/gemm/Gemm_old_sm100f.cubin": cubin(100, abi=7),  # a layout not read: kept
    f"flashinfer_cubin/cubins/{COMMIT}/gemm/Gemm_named_sm90a.cubin": cubin(100),  # name and header differ: kept
    f"flashinfer_cubin/cubins/{COMMIT}/fmha/trtllm-gen/include/flashInferMetaInfo.h": b"// kernels\n",
    f"flashinfer_cubin/cubins/{COMMIT}/fmha/trtllm-gen/checksums.txt": b"00 x.cubin\n",
}
PRUNED = [p for p in FILES if "Sm10" in p or "deep-gemm" in p]


def _record(files: dict[str, bytes], info: str) -> str:
    rows = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
            for p, d in files.items()]
    return "\n".join([*rows, f"{info}/RECORD,,"]) + "\n"


def _dist_info(files: dict[str, bytes]) -> dict[str, bytes]:
    info = f"flashinfer_cubin-{VERSION}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: slimeforge-tests\nRoot-Is-Purelib: true\n"
                             b"Tag: py3-none-any\n"}
    every = {**files, **meta}
    return {**meta, f"{info}/RECORD": _record(every, info).encode()}


def install_tree(site: Path) -> None:
    """The distribution as an installer leaves it in `site` (its files, METADATA, RECORD)."""
    for rel, data in {**FILES, **_dist_info(FILES)}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)


def make_wheel(directory: Path) -> Path:
    path = directory / f"flashinfer_cubin-{VERSION}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for rel, data in {**FILES, **_dist_info(FILES)}.items():
            zf.writestr(zipfile.ZipInfo(rel, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path
