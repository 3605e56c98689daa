"""Resource usage of a compiled kernel read straight from its cubin (an ELF file).

No disassembler needed for these: registers come from the EIATTR_REGCOUNT attribute of
.nv.info, spills from the per-thread stack frame (EIATTR_FRAME_SIZE), static shared memory from
the .nv.shared.<kernel> section. Agrees with `ptxas -v` on the builds it was checked against.
Which tensor-core instruction the code issues needs the SASS: disassemble() and mma_class() below.
"""

from __future__ import annotations

import os
import re
import struct
from collections import Counter

from variants.base import ResourceUsage

_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


def _elf_sections(blob: bytes) -> list[dict]:
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    sections = []
    for i in range(shnum):
        name, _typ, _flags, _addr, off, size, _link, info, _align, _ent = struct.unpack_from(
            "<IIQQQQIIQQ", blob, shoff + i * shentsize)
        sections.append({"name_off": name, "off": off, "size": size, "info": info})
    strtab = sections[shstrndx]["off"]
    for s in sections:
        start = strtab + s["name_off"]
        s["name"] = blob[start:blob.index(b"\0", start)].decode()
    return sections


def _nv_info_attrs(data: bytes):
    """(attribute, payload bytes) of an .nv.info section."""
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _EIFMT_SVAL:
            size = struct.unpack_from("<H", data, i + 2)[0]
            yield attr, data[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt == _EIFMT_HVAL:
            yield attr, data[i + 2:i + 4]
            i += 4
        elif fmt == _EIFMT_BVAL:
            yield attr, data[i + 2:i + 3]
            i += 3
        else:
            yield attr, b""
            i += 2


def cubin_resources(cubin: bytes, dynamic_smem: int) -> ResourceUsage:
    """Registers, stack frame (spill) bytes and shared memory of the kernel in a cubin.

    Registers: EIATTR_REGCOUNT of the global .nv.info (fallback: bits 24..31 of the kernel's
    .text section sh_info). Spill bytes: the largest EIATTR_FRAME_SIZE, the per-thread local
    memory frame, which is where ptxas puts spilled registers (and, rarely, dynamically indexed
    register arrays). Shared memory: static .nv.shared.<kernel> plus the dynamic bytes the launch
    requests.
    """
    sections = _elf_sections(cubin)
    regs = 0
    frame = 0
    static_smem = 0
    for s in sections:
        data = cubin[s["off"]:s["off"] + s["size"]]
        if s["name"] == ".nv.info":
            for attr, payload in _nv_info_attrs(data):
                if attr == _EIATTR_REGCOUNT and len(payload) >= 8:
                    regs = max(regs, struct.unpack_from("<I", payload, 4)[0])
                elif attr == _EIATTR_FRAME_SIZE and len(payload) >= 8:
                    frame = max(frame, struct.unpack_from("<I", payload, 4)[0])
        elif s["name"].startswith(".text.") and not regs:
            regs = s["info"] >> 24
        elif (s["name"].startswith(".nv.shared.")
              and not s["name"].startswith(".nv.shared.reserved")):
            static_smem += s["size"]
    return ResourceUsage(registers=regs, spill_bytes=frame, smem_bytes=static_smem + dynamic_smem)


# ---- machine code: the SASS the cubin really holds ---------------------------------------
#
# Registers and spills need no tool (above); the instruction a config promises does: nvdisasm, from
# the `nvidia-cuda-nvdisasm` wheel (a dev dependency) or a CUDA toolkit on PATH.

def nvdisasm_path() -> str | None:
    """nvdisasm on PATH, else the one the nvidia-cuda-nvdisasm wheel installs (nvidia/cu*/bin)."""
    import glob
    import shutil

    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        hits = sorted(glob.glob(os.path.join(root, "*", "bin", "nvdisasm")))
        if hits:
            return hits[-1]
    return None


def disassemble(cubin: bytes) -> str:
    """The SASS of every kernel in the cubin (nvdisasm -c: code sections only)."""
    import subprocess
    import tempfile

    tool = nvdisasm_path()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm "
                                "(the dev extra) or put a CUDA toolkit's bin on PATH")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout


# A tensor-core opcode with its modifiers, e.g. QMMA.16832.F32.E4M3.E4M3 (sm_89/sm_120 FP8 MMA,
# f32 accumulate), QMMA.16832.F16.E4M3.E4M3 (f16 accumulate), QMMA.SF.16832.F32.E4M3.E4M3.E8
# (block-scaled, UE8M0 scales), HMMA.16816.F32 (sm_90's emulation of FP8 mma.sync in f16).
_MMA_OPCODE = re.compile(r"\b([A-Z]*MMA(?:\.[A-Z0-9_]+)+)")
_LOCAL_MEMORY = re.compile(r"\b(LDL|STL)(?:\.[A-Z0-9_]+)*\b")


def mma_opcodes(sass: str) -> Counter:
    """How many times each MMA opcode (with modifiers) occurs in the code."""
    return Counter(_MMA_OPCODE.findall(sass))


def local_memory_ops(sass: str) -> int:
    """LDL/STL instructions: loads and stores of the per-thread local-memory (spill) frame."""
    return len(_LOCAL_MEMORY.findall(sass))


def mma_class(opcodes: Counter) -> str:
    """Short label of the MMA instructions, e.g. 'QMMA.F32 x32 + QMMA.F16 x32': each distinct
    opcode less its shape and its E4M3 operand types (the same for every mma_sync config), with
    its count in the code (the unrolled loop body: each MMA of one strip once)."""
    def short(op: str) -> str:
        return ".".join(p for p in op.split(".") if not p.isdigit() and p != "E4M3")

    merged = Counter()
    for op, n in opcodes.items():
        merged[short(op)] += n
    return " + ".join(f"{op} x{n}" for op, n in sorted(merged.items())) or "none"
