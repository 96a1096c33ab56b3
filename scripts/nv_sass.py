#!/usr/bin/env python3
"""The machine code (SASS) that NVIDIA's Vulkan driver compiled for Hierarchos' kernels, read back from the
driver's shader disk cache, with each kernel's registers and the instruction mix of its main loop.

Vulkan offers no disassembler, but the driver keeps what it compiled in `~/.cache/nvidia/GLCache/*/*/*.bin`:
zstd frames, some of which hold an `NVDANVVMNVuc` container with the raw instruction stream. `nvdisasm -b SMxx`
reads such a stream once the code's first byte is found, which this script does by trial (the container's
header varies in length). What it tells is what the compiler did with a kernel: how many registers it took (and
so how many workgroups fit on a multiprocessor), whether arrays went to local memory, and how many instructions
of a loop are not the arithmetic it exists for.

Run a kernel once on a clean cache (`rm -rf ~/.cache/nvidia`), then, on the GPU machine or wherever the cache
file was copied to:
    python3 scripts/nv_sass.py ~/.cache/nvidia/GLCache --out /tmp/sass [--arch SM90] [--nvdisasm PATH]
Needs the `zstandard` Python package and `nvdisasm` (CUDA's, or PyPI's `nvidia-cuda-nvdisasm` wheel). The H200
machine has nvdisasm but no zstandard: copy the cache file back and run the script where pip can install it.
Kernels come in the order the driver cached them, unnamed: the summary (registers, main-loop mix) tells them
apart.
"""
import argparse
import collections
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import zstandard

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CONTAINER_MAGIC = b"NVDANVVMNVuc"
# `EXIT` as its low 64 bits encode it on sm_80 and later: the code ends at the container's last one.
EXIT = bytes.fromhex("4d79000000000000")
ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")
OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def containers(data):
    """The compiled-code containers among the zstd frames of one cache file."""
    at = data.find(ZSTD_MAGIC)
    while at >= 0:
        try:
            blob = zstandard.ZstdDecompressor().decompressobj().decompress(data[at:])
            if blob.startswith(CONTAINER_MAGIC):
                yield blob
        except zstandard.ZstdError:
            pass
        at = data.find(ZSTD_MAGIC, at + len(ZSTD_MAGIC))


def disassemble(blob, arch, nvdisasm, scratch):
    """The SASS of a container's code, or None: the first 8-byte-aligned start that nvdisasm reads cleanly up
    to the last EXIT (instructions are 16 bytes, so the start lies a multiple of 16 before it)."""
    exits = [i for i in range(0, len(blob) - 8, 8) if blob[i:i + 8] == EXIT]
    if not exits:
        return None
    end = exits[-1]
    for start in range(8, min(end, 8192), 8):
        if (end - start) % 16:
            continue
        scratch.write_bytes(blob[start:end + 16])
        run = subprocess.run([nvdisasm, "-b", arch, str(scratch)], capture_output=True, text=True)
        if run.returncode == 0 and "error" not in run.stderr and "/*0000*/" in run.stdout:
            return run.stdout
    return None


def main_loop(sass):
    """Instructions of the longest backward branch's body (the kernel's main loop), by opcode."""
    lines = [(int(m.group(1), 16), line) for line in sass.splitlines() if (m := ADDRESS.search(line))]
    best = None
    for address, line in lines:
        branch = re.search(r"BRA (0x[0-9a-f]+)", line)
        if branch and int(branch.group(1), 16) < address:
            span = (int(branch.group(1), 16), address)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return None
    return collections.Counter(
        m.group(1) for address, line in lines if best[0] <= address <= best[1] and (m := OPCODE.search(line))
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=pathlib.Path, help="cache files or folders holding them")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for kernel_N.sass")
    parser.add_argument("--arch", default="SM90", help="nvdisasm's name of the GPU's architecture")
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    args = parser.parse_args()
    files = [f for p in args.paths for f in (sorted(p.rglob("*.bin")) if p.is_dir() else [p])]
    if not files:
        sys.exit(f"no cache files under {', '.join(map(str, args.paths))}")
    args.out.mkdir(parents=True, exist_ok=True)
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = pathlib.Path(tmp) / "code.bin"
        for f in files:
            for blob in containers(f.read_bytes()):
                sass = disassemble(blob, args.arch, args.nvdisasm, scratch)
                if sass is None:
                    continue
                (args.out / f"kernel_{n}.sass").write_text(sass)
                registers = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1
                loop = main_loop(sass)
                mix = "no loop" if loop is None else f"loop of {sum(loop.values())}: " + " ".join(
                    f"{op} {count}" for op, count in loop.most_common(10))
                print(f"kernel_{n}: {sass.count(chr(10))} lines, registers R0-R{registers - 1}; {mix}")
                n += 1
    if n == 0:
        sys.exit("no compiled code found (was the cache written by this driver, and is nvdisasm's --arch right?)")


if __name__ == "__main__":
    main()
