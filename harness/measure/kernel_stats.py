"""Statistics of one compiled kernel variant, read from the compiler's own artifacts: the texts and
binaries Triton keeps per variant (its cache entry: ttgir, ptx or amdgcn, cubin or hsaco, and the
metadata json). Pure functions of those artifacts; nothing is estimated.

Which parser runs depends on which artifact the compiler produced, not on a vendor: a cubin is
disassembled to SASS (cuobjdump, which Triton's wheel ships) and counted there; without the tool the
PTX is counted instead, and the record says which (`instructions from`). AMDGCN text carries its own
resource notes (`.vgpr_count`, `; Occupancy:`). A field no artifact answers is NOT_AVAILABLE.

A record is one flat, ordered dict (field -> int or str), so two records compare field by field
(reports.explain). Counts are static: instructions in the binary, not executed ones.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from harness.core import bounded
from harness.core.ir_index import NOT_AVAILABLE

FORMAT = 1
LOAD_WIDTHS = (8, 16, 32, 64, 96, 128, 256)
TOOL_TIMEOUT_S = 60

# --- tools ---------------------------------------------------------------------------------------


def tool_dirs() -> list[Path]:
    """Where the disassemblers are looked for: the bin dirs of the installed Triton's backends
    (its wheel ships them there), then PATH."""
    try:
        import triton
    except ImportError:
        return []
    return sorted(Path(triton.__file__).parent.glob("backends/*/bin"))


def find_tools(dirs: Iterable[Path] | None = None, use_path: bool = True) -> dict[str, str | None]:
    """name -> executable for the tools the parsers can use; None where absent."""
    search = [str(d) for d in (tool_dirs() if dirs is None else dirs)]
    if use_path:
        search.append(os.environ.get("PATH", ""))
    path = os.pathsep.join(p for p in search if p)
    return {name: shutil.which(name, path=path) if path else None for name in ("cuobjdump", "nvdisasm")}


def _run_tool(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def disassemble(cubin: bytes, tools: Mapping[str, str | None]) -> tuple[str | None, str | None]:
    """(SASS text, cuobjdump's resource-usage text) of a cubin; None for what no tool gave."""
    with tempfile.TemporaryDirectory(prefix="zl_sass_") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        if tools.get("cuobjdump"):
            out = _run_tool([tools["cuobjdump"], "-res-usage", "-sass", str(path)])
            if out is not None:
                return out, out
        if tools.get("nvdisasm"):
            return _run_tool([tools["nvdisasm"], "-c", str(path)]), None
    return None, None


# --- instruction classes ---------------------------------------------------------------------------
# One table per instruction language: class -> predicate on the opcode (SASS: `LDG.E.128`; PTX:
# `ld.global.v4.b32`; AMDGCN: `global_load_dwordx4`). A class absent from a language's table is
# NOT_AVAILABLE there (AMDGCN has no wgmma, SASS and PTX no mfma).
CLASSES = ("wgmma", "mma.sync", "tcgen05.mma", "mfma", "wmma", "cp.async", "TMA", "bulk copies", "shared loads",
           "shared stores", "local loads", "local stores", "barriers", "branches", "fp32 arith", "fp16 arith")

_SASS = {
    "wgmma": lambda op: op.startswith("HGMMA"),
    "mma.sync": lambda op: op.split(".")[0] in ("HMMA", "IMMA", "DMMA", "BMMA"),
    "tcgen05.mma": lambda op: op.startswith("UTC") and "MMA" in op,
    "cp.async": lambda op: op.startswith("LDGSTS"),
    "TMA": lambda op: op.startswith(("UTMALDG", "UTMASTG", "UTMAREDG", "UTMAPF")),
    "bulk copies": lambda op: op.startswith("UBLKCP"),
    "shared loads": lambda op: op.split(".")[0] in ("LDS", "LDSM"),
    "shared stores": lambda op: op.split(".")[0] in ("STS", "STSM"),
    "local loads": lambda op: op.split(".")[0] == "LDL",
    "local stores": lambda op: op.split(".")[0] == "STL",
    "barriers": lambda op: op.split(".")[0] in ("BAR", "SYNCS", "MEMBAR", "WARPSYNC"),
    "branches": lambda op: op.split(".")[0] in ("BRA", "BRX", "JMP", "JMX"),
    "fp32 arith": lambda op: op.split(".")[0] in ("FFMA", "FADD", "FMUL", "FMNMX", "FFMA2", "FADD2", "FMUL2"),
    # HFMA2.MMA is ptxas's idiom for moving a constant into a register, not arithmetic.
    "fp16 arith": lambda op: op.split(".")[0] in ("HFMA2", "HADD2", "HMUL2", "HMNMX2") and ".MMA" not in op,
}
_PTX = {
    "wgmma": lambda op: op.startswith("wgmma.mma_async"),
    "mma.sync": lambda op: op.startswith("mma.sync"),
    "tcgen05.mma": lambda op: op.startswith("tcgen05.mma"),
    "cp.async": lambda op: op.startswith("cp.async.") and op.split(".")[2] in ("ca", "cg"),
    "TMA": lambda op: op.startswith(("cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor")),
    "bulk copies": lambda op: op.startswith("cp.async.bulk.") and not op.startswith("cp.async.bulk.tensor")
                              and ".global" in op,
    "shared loads": lambda op: op.startswith(("ld.shared", "ldmatrix")),
    "shared stores": lambda op: op.startswith(("st.shared", "stmatrix")),
    "local loads": lambda op: op.startswith("ld.local"),
    "local stores": lambda op: op.startswith("st.local"),
    "barriers": lambda op: op.startswith(("bar.", "barrier.", "mbarrier.")),
    "branches": lambda op: op.split(".")[0] in ("bra", "brx"),
    "fp32 arith": lambda op: op.split(".")[0] in ("fma", "add", "sub", "mul", "max", "min") and op.endswith(".f32"),
    "fp16 arith": lambda op: op.split(".")[0] in ("fma", "add", "sub", "mul", "max", "min")
                             and op.endswith((".f16", ".f16x2", ".bf16", ".bf16x2")),
}
_AMDGCN = {
    "mfma": lambda op: op.startswith("v_mfma"),
    "wmma": lambda op: op.startswith("v_wmma"),
    "shared loads": lambda op: op.startswith("ds_read") or op.startswith("ds_load"),
    "shared stores": lambda op: op.startswith("ds_write") or op.startswith("ds_store"),
    "local loads": lambda op: op.startswith("scratch_load"),
    "local stores": lambda op: op.startswith("scratch_store"),
    "barriers": lambda op: op.startswith("s_barrier"),
    "branches": lambda op: op.startswith(("s_branch", "s_cbranch", "s_setpc")),
    "fp32 arith": lambda op: op.startswith(("v_fma_f32", "v_fmac_f32", "v_add_f32", "v_sub_f32", "v_mul_f32",
                                            "v_max_f32", "v_min_f32", "v_pk_fma_f32", "v_pk_add_f32",
                                            "v_pk_mul_f32")),
    "fp16 arith": lambda op: op.startswith(("v_fma_f16", "v_fmac_f16", "v_add_f16", "v_mul_f16", "v_pk_fma_f16",
                                            "v_pk_add_f16", "v_pk_mul_f16", "v_pk_max_f16", "v_dot2")),
}

_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", re.MULTILINE)
_PTX_LINE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][a-z0-9_]*(?:\.[A-Za-z0-9_:]+)*)", re.MULTILINE)
_AMDGCN_LINE = re.compile(r"^\s+([a-z][a-z0-9_]+)(?:\s|$)", re.MULTILINE)
_PTX_BITS = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16, "b32": 32,
             "u32": 32, "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64, "f64": 64, "b128": 128}
_AMD_BITS = {"ubyte": 8, "sbyte": 8, "byte": 8, "ushort": 16, "sshort": 16, "short": 16, "short_d16": 16,
             "dword": 32, "b32": 32, "dwordx2": 64, "b64": 64, "dwordx3": 96, "b96": 96, "dwordx4": 128, "b128": 128}


_LANGUAGES = {"sass": (_SASS_LINE, _SASS), "ptx": (_PTX_LINE, _PTX), "amdgcn": (_AMDGCN_LINE, _AMDGCN)}


def _sass_width(op: str) -> int:
    parts = op.split(".")[1:]
    for p in parts:
        if p in ("64", "128", "256"):
            return int(p)
        if p in ("U8", "S8"):
            return 8
        if p in ("U16", "S16"):
            return 16
    return 32


def _ptx_width(op: str) -> int | None:
    parts = op.split(".")
    vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
    bits = next((_PTX_BITS[p] for p in reversed(parts) if p in _PTX_BITS), None)
    return vec * bits if bits else None


def _amd_width(op: str) -> int | None:
    for prefix in ("global_load_", "buffer_load_", "global_store_", "buffer_store_"):
        if op.startswith(prefix):
            return _AMD_BITS.get(op[len(prefix):].removeprefix("lds_"))
    return None


def _memory_kind(op: str, language: str) -> tuple[str, int | None] | None:
    """('load'|'store', width in bits) for a global memory access, else None."""
    if language == "sass":
        head = op.split(".")[0]
        if head in ("LDG", "STG"):
            return ("load" if head == "LDG" else "store"), _sass_width(op)
        return None
    if language == "ptx":
        if op.startswith(("ld.global", "st.global")):
            return ("load" if op.startswith("ld") else "store"), _ptx_width(op)
        return None
    if op.startswith(("global_load", "buffer_load")):
        return "load", _amd_width(op)
    if op.startswith(("global_store", "buffer_store")):
        return "store", _amd_width(op)
    return None


def count_instructions(text: str, language: str) -> dict:
    """Instruction counts by class (CLASSES) and global loads/stores by width, for `language` sass,
    ptx or amdgcn. Classes the language has no table entry for are NOT_AVAILABLE."""
    pattern, table = _LANGUAGES[language]
    ops = pattern.findall(text)
    out: dict = {"instructions from": language, "instructions": len(ops)}
    counts = collections.Counter()
    widths = {"load": collections.Counter(), "store": collections.Counter()}
    for op in ops:
        for cls, test in table.items():
            if test(op):
                counts[cls] += 1
        mem = _memory_kind(op, language)
        if mem is not None:
            widths[mem[0]][mem[1]] += 1
    for cls in CLASSES:
        out[cls] = counts[cls] if cls in table else NOT_AVAILABLE
    if language == "amdgcn":
        out["buffer loads"] = sum(1 for op in ops if op.startswith("buffer_load"))
    for kind in ("load", "store"):
        seen = widths[kind]
        out[f"global {kind} widths"] = ",".join(str(w) for w in sorted(w for w in seen if w)) or "none"
        for w in LOAD_WIDTHS:
            out[f"global {kind}s {w}-bit"] = seen[w]
    return out


# --- resources -----------------------------------------------------------------------------------
_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def sass_resources(res_usage: str) -> dict:
    m = _RES.search(res_usage or "")
    if not m:
        return {}
    return {"regs": int(m[1]), "stack bytes": int(m[2]), "local bytes": int(m[4])}


def _amd_note(text: str, key: str) -> int | None:
    m = re.search(rf"^\s*\.{re.escape(key)}:\s+(\d+)", text, re.MULTILINE)
    return int(m[1]) if m else None


def amdgcn_resources(text: str) -> dict:
    out = {}
    for field, key in (("regs", "vgpr_count"), ("scalar regs", "sgpr_count"), ("stack bytes",
                                                                                "private_segment_fixed_size")):
        value = _amd_note(text, key)
        if value is not None:
            out[field] = value
    spills = [_amd_note(text, k) for k in ("vgpr_spill_count", "sgpr_spill_count")]
    if any(s is not None for s in spills):
        out["spilled regs"] = sum(s or 0 for s in spills)
    m = re.search(r"^; Occupancy: (\d+)", text, re.MULTILINE)
    if m:
        out["occupancy"] = f"{m[1]} waves/SIMD (compiler)"
    return out


def occupancy_bound(regs: int, smem: int, warps: int, warp_size: int, limits: Mapping) -> str:
    """An upper bound on resident CTAs per SM from the device's limits (regs_per_sm, threads_per_sm,
    smem_per_sm; what the device reports, reserved per-block shared memory not included) and the
    kernel's resources, with the resource that binds: `3 CTAs/SM (registers)`."""
    threads = warps * warp_size
    bounds = {"threads": limits["threads_per_sm"] // threads}
    if regs:
        # Registers are allocated per warp in units of 256.
        per_warp = -(-regs * warp_size // 256) * 256
        bounds["registers"] = (limits["regs_per_sm"] // per_warp) // warps
    if smem:
        bounds["shared memory"] = limits["smem_per_sm"] // smem
    binding = min(bounds, key=bounds.get)
    return f"{bounds[binding]} CTAs/SM ({binding})"


# --- TTGIR -----------------------------------------------------------------------------------------
_LAYOUT_DEF = re.compile(r"^#\w+ = #ttg\.(\w+)<(.*)>\s*$", re.MULTILINE)
_MMA_VERSION = re.compile(r"version(?:Major)? = (\d+)(?:, versionMinor = (\d+))?")
_INSTR_SHAPE = re.compile(r"instrShape = \[([\d, ]+)\]")
_ALLOC = re.compile(r"ttg\.local_alloc\b[^\n]*?!ttg\.memdesc<([\dx]+)x[a-z]\w*,[^\n]*?mutable")
_DOT_OPS = ("ttng.warp_group_dot", "tt.dot", "tt.dot_scaled", "ttng.tc_gen5_mma", "ttng.tc_gen5_mma_scaled")
_COPY_OPS = {"async copies": ("ttg.async_copy_global_to_local",),
             "TMA ops": ("ttng.async_tma_copy_global_to_local", "ttng.async_tma_copy_local_to_global",
                         "tt.descriptor_load", "tt.descriptor_store")}


def ttgir_stats(text: str) -> dict:
    """From TTGIR: the MMA layout (kind, version, instruction shape), the layouts defined, the dot ops,
    the pipeline buffers (depth of each multi-buffered shared allocation) and async/TMA copies."""
    layouts = collections.Counter()
    mma = "none"
    for kind, body in _LAYOUT_DEF.findall(text):
        layouts[kind] += 1
        if kind.endswith(("_mma", "_mfma", "_wmma")):
            v = _MMA_VERSION.search(body)
            shape = _INSTR_SHAPE.search(body)
            version = (f" v{v[1]}" + (f".{v[2]}" if v[2] else "")) if v else ""
            mma = f"{kind}{version}" + (f" [{shape[1]}]" if shape else "")
    ops = collections.Counter(m for m in re.findall(r"=\s*([a-z_]+\.[a-z_0-9]+)\b", text))
    ops.update(m for m in re.findall(r"^\s+([a-z_]+\.[a-z_0-9]+)\b", text, re.MULTILINE))
    dots = [f"{op} x{ops[op]}" for op in _DOT_OPS if ops[op]]
    depths = sorted((int(shape.split("x")[0]) for shape in _ALLOC.findall(text) if shape.count("x") >= 2),
                    reverse=True)
    out = {"mma layout": mma, "dot ops": ", ".join(dots) or "none",
           "layouts": ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(layouts.items())) or "none",
           "pipeline buffers": ",".join(map(str, depths)) or "none"}
    for field, names in _COPY_OPS.items():
        out[field] = sum(ops[n] for n in names)
    return out


# --- one variant -----------------------------------------------------------------------------------
RESOURCE_FIELDS = ("regs", "scalar regs", "spill bytes", "spilled regs", "stack bytes", "local bytes", "smem",
                   "warps", "stages", "ctas", "occupancy")


def extract(asm: Mapping[str, object], metadata: Mapping, tools: Mapping[str, str | None],
            limits: Mapping | None = None, loaded: Mapping | None = None) -> dict:
    """The record of one compiled variant. `asm`: stage -> text or bytes (Triton's `asm` dict, or its
    cache entry's files by suffix); `metadata`: its metadata json; `tools`: find_tools(); `limits`:
    the device's (occupancy_bound), None off the device; `loaded`: what the driver reported on
    loading it (`n_regs`, `n_spills` in 32-bit words), None where it was not loaded."""
    out: dict = {field: NOT_AVAILABLE for field in RESOURCE_FIELDS}
    out.update({"smem": metadata.get("shared", NOT_AVAILABLE), "warps": metadata.get("num_warps", NOT_AVAILABLE),
                "stages": metadata.get("num_stages", NOT_AVAILABLE), "ctas": metadata.get("num_ctas", NOT_AVAILABLE)})
    loaded = loaded or {}
    if loaded.get("n_regs") is not None:
        out["regs"] = int(loaded["n_regs"])
    if loaded.get("n_spills") is not None:
        out["spill bytes"] = 4 * int(loaded["n_spills"])
    counts = None
    if isinstance(asm.get("cubin"), bytes):
        sass, res = disassemble(asm["cubin"], tools)
        out.update(sass_resources(res))
        if sass:
            counts = count_instructions(sass, "sass")
    if counts is None and isinstance(asm.get("amdgcn"), str):
        out.update(amdgcn_resources(asm["amdgcn"]))
        counts = count_instructions(asm["amdgcn"], "amdgcn")
    if counts is None and isinstance(asm.get("ptx"), str):
        counts = count_instructions(asm["ptx"], "ptx")
    if out["occupancy"] == NOT_AVAILABLE and limits and isinstance(out["warps"], int):
        regs = out["regs"] if isinstance(out["regs"], int) else None
        smem = out["smem"] if isinstance(out["smem"], int) else 0
        if regs is not None:  # without registers a bound would leave out the usual limiter
            out["occupancy"] = occupancy_bound(regs, smem, out["warps"], int(metadata.get("warp_size", 32)), limits)
    out.update(counts or dict.fromkeys(("instructions from", "instructions", *CLASSES, "global load widths",
                                        "global store widths"), NOT_AVAILABLE))
    ttgir = asm.get("ttgir")
    if isinstance(ttgir, str) and ttgir:
        out.update(ttgir_stats(ttgir))
    else:
        out.update({k: NOT_AVAILABLE for k in ("mma layout", "dot ops", "layouts", "pipeline buffers",
                                                *_COPY_OPS)})
    return out


def read_cache_entry(entry_dir: Path) -> tuple[dict, dict]:
    """(asm, metadata) of one Triton cache entry (a dir holding `<name>.<stage>` files and
    `<name>.json`): binaries by their suffix as bytes, texts as str."""
    asm, metadata = {}, {}
    for path in sorted(Path(entry_dir).iterdir()):
        stage = path.suffix[1:]
        if stage == "json" and not path.name.startswith("__grp__"):
            metadata = bounded.read_json(path, "compiled kernel file")
        elif stage in ("cubin", "hsaco"):
            asm[stage] = bounded.read_bounded(path, "compiled kernel file")
        elif stage in ("ttir", "ttgir", "llir", "ptx", "amdgcn"):
            asm[stage] = bounded.read_text(path, "compiled kernel file")
    return asm, metadata
