"""Kernel statistics (harness.measure.kernel_stats) of kernels really compiled on this CPU for sm_90
and gfx942 (resources/ir_kernels/stats_kernels.py), read from their Triton cache entries, asserted
against what each kernel is known to be: a vectorized copy moves 128 bits per access, the same copy
over a size not divisible by 16 does not, a dot on sm_90 runs on wgmma, and on mma.sync once
DISABLE_MMA_V3=1 turns Hopper's MMA off."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from harness.core.ir_index import NOT_AVAILABLE
from harness.measure import kernel_stats

KERNELS = REPO / "tests" / "resources" / "ir_kernels"
H200 = {"regs_per_sm": 65536, "threads_per_sm": 2048, "smem_per_sm": 233472}  # what an H200 reports


def compile_for(tmp_dir, backend, arch, **env):
    """{label: (asm, metadata)} of the stats kernels compiled for (backend, arch) in a fresh process."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DISABLE_MMA_V3")}
    environ.update(TRITON_CACHE_DIR=str(tmp_dir), TRITON_DEFAULT_FP_FUSION="1", **env)
    proc = subprocess.run([sys.executable, str(KERNELS / "stats_kernels.py"), backend, arch], env=environ,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        # Only a Triton build without that backend's code generation tools (ptxas, ld.lld) cannot.
        assert "ptxas" in proc.stderr or "lld" in proc.stderr or "FileNotFoundError" in proc.stderr, proc.stderr
        pytest.skip(f"cannot compile for {arch} here: {proc.stderr.strip().splitlines()[-1]}")
    return {label: kernel_stats.read_cache_entry(d) for label, d in json.loads(proc.stdout).items()}


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    return compile_for(tmp_path_factory.mktemp("sm90"), "cuda", "90")


@pytest.fixture(scope="module")
def sm90_mma_v2(tmp_path_factory):
    return compile_for(tmp_path_factory.mktemp("sm90_v2"), "cuda", "90", DISABLE_MMA_V3="1")


@pytest.fixture(scope="module")
def gfx942(tmp_path_factory):
    return compile_for(tmp_path_factory.mktemp("gfx942"), "hip", "gfx942")


@pytest.fixture(scope="module")
def tools():
    found = kernel_stats.find_tools()
    if not found["cuobjdump"]:
        pytest.skip("this Triton ships no cuobjdump")
    return found


def stats(kernels, label, tools, limits=None):
    return kernel_stats.extract(*kernels[label], tools, limits)


def test_a_vectorized_copy_moves_128_bits_per_global_access(sm90, tools):
    s = stats(sm90, "copy_aligned", tools)
    assert s["instructions from"] == "sass"
    assert s["global load widths"] == "128" and s["global store widths"] == "128"
    assert s["global loads 128-bit"] > 0 and s["global loads 32-bit"] == 0
    assert s["wgmma"] == 0 and s["mma.sync"] == 0 and s["mma layout"] == "none"
    assert isinstance(s["regs"], int) and s["regs"] > 0 and s["smem"] == 0 and s["warps"] == 4


def test_the_same_copy_over_a_misaligned_size_is_not_vectorized(sm90, tools):
    s = stats(sm90, "copy_misaligned", tools)
    assert s["global load widths"] == "32" and s["global loads 128-bit"] == 0 and s["global loads 32-bit"] > 0
    assert s["global store widths"] == "32"


def test_a_dot_on_sm90_runs_on_wgmma_with_three_pipeline_buffers(sm90, tools):
    s = stats(sm90, "dot", tools, H200)
    assert s["wgmma"] > 0 and s["mma.sync"] == 0
    assert s["mma layout"].startswith("nvidia_mma v3.")
    assert "ttng.warp_group_dot" in s["dot ops"] and "tt.dot " not in s["dot ops"]
    assert s["pipeline buffers"] == "3,3"  # A's and B's tiles, 3 stages each
    assert s["cp.async"] > 0 and s["async copies"] > 0
    assert s["smem"] == 3 * (128 * 64 + 64 * 128) * 2  # 3 stages of the fp16 A and B tiles
    # 96 KB bounds it to 2 CTAs of an H200's 228 KB; no register count (at most 255) binds tighter.
    assert s["occupancy"] in ("2 CTAs/SM (shared memory)", "2 CTAs/SM (registers)")


def test_disable_mma_v3_turns_the_dot_to_mma_sync(sm90_mma_v2, tools):
    """DISABLE_MMA_V3=1 works on the installed Triton: the same dot compiles to mma.sync (MMA v2)."""
    s = stats(sm90_mma_v2, "dot", tools)
    assert s["mma.sync"] > 0 and s["wgmma"] == 0
    assert s["mma layout"].startswith("nvidia_mma v2.") and s["dot ops"] == "tt.dot x1"


def test_without_the_disassemblers_counts_come_from_ptx_and_resources_say_not_available(sm90, tmp_path):
    no_tools = kernel_stats.find_tools(dirs=[tmp_path], use_path=False)
    assert no_tools == {"cuobjdump": None, "nvdisasm": None}
    s = stats(sm90, "dot", no_tools, H200)
    assert s["instructions from"] == "ptx"
    assert s["wgmma"] > 0 and s["mma.sync"] == 0  # wgmma.mma_async in the PTX
    for field in ("regs", "stack bytes", "local bytes", "spill bytes", "occupancy"):
        assert s[field] == NOT_AVAILABLE, field  # registers exist only once ptxas ran: never guessed
    copy = stats(sm90, "copy_aligned", no_tools)
    assert copy["global load widths"] == "128" and copy["global loads 128-bit"] > 0  # ld.global.v4.b32
    misaligned = stats(sm90, "copy_misaligned", no_tools)
    assert misaligned["global load widths"] == "32"


def test_ptx_and_sass_agree_on_the_matrix_instructions(sm90, sm90_mma_v2, tools, tmp_path):
    """Each wgmma.mma_async is one HGMMA, each mma.sync.m16n8k16 one HMMA.16816: the PTX fallback counts
    the same matrix instructions as the disassembly."""
    no_tools = kernel_stats.find_tools(dirs=[tmp_path], use_path=False)
    for kernels in (sm90, sm90_mma_v2):
        sass, ptx = stats(kernels, "dot", tools), stats(kernels, "dot", no_tools)
        assert (ptx["wgmma"], ptx["mma.sync"]) == (sass["wgmma"], sass["mma.sync"])
        assert ptx["global stores 128-bit"] == sass["global stores 128-bit"] > 0


def test_nvdisasm_alone_gives_the_same_sass_counts_and_no_registers(sm90, tools):
    if not tools["nvdisasm"]:
        pytest.skip("this Triton ships no nvdisasm")
    both, alone = stats(sm90, "dot", tools), stats(sm90, "dot", {"cuobjdump": None, "nvdisasm": tools["nvdisasm"]})
    assert alone["instructions from"] == "sass" and alone["regs"] == NOT_AVAILABLE  # no resource usage from it
    assert {k: alone[k] for k in kernel_stats.CLASSES} == {k: both[k] for k in kernel_stats.CLASSES}


def test_the_driver_s_counts_fill_registers_and_spills_where_the_kernel_was_loaded(sm90, tmp_path):
    no_tools = kernel_stats.find_tools(dirs=[tmp_path], use_path=False)
    s = kernel_stats.extract(*sm90["dot"], no_tools, H200, loaded={"n_regs": 168, "n_spills": 3})
    assert s["regs"] == 168 and s["spill bytes"] == 12
    assert s["occupancy"] == "2 CTAs/SM (shared memory)"  # 168 regs would allow 3


def test_amdgcn_reports_mfma_registers_and_the_compiler_s_occupancy(gfx942, tools):
    s = stats(gfx942, "dot", tools)
    assert s["instructions from"] == "amdgcn"
    assert s["mfma"] > 0 and s["wgmma"] == NOT_AVAILABLE
    assert s["mma layout"].startswith("amd_mfma")
    assert isinstance(s["regs"], int) and isinstance(s["scalar regs"], int)
    assert s["occupancy"].endswith("waves/SIMD (compiler)")
    copy = stats(gfx942, "copy_aligned", tools)
    assert copy["global load widths"] == "128" and copy["mfma"] == 0
    assert stats(gfx942, "copy_misaligned", tools)["global load widths"] == "32"


@pytest.mark.parametrize("regs,smem,warps,expected", [
    (168, 98304, 4, "2 CTAs/SM (shared memory)"),   # 233472 // 98304
    (248, 65536, 4, "2 CTAs/SM (registers)"),       # 248 regs -> 8192 per warp -> 8 warps
    (18, 0, 4, "16 CTAs/SM (threads)"),             # 2048 threads / 128
    (32, 0, 8, "8 CTAs/SM (threads)"),
    (64, 1024, 8, "4 CTAs/SM (registers)"),         # 64 regs x 32 = 2048 per warp, 32 warps
])
def test_occupancy_bound_names_the_binding_resource(regs, smem, warps, expected):
    assert kernel_stats.occupancy_bound(regs, smem, warps, 32, H200) == expected


def test_sass_widths_and_classes_from_opcodes():
    sass = "\n".join(f"        /*{i:04x}*/   {op} ;" for i, op in enumerate([
        "LDG.E.128 R4, desc[UR4][R8.64]", "@!P0 LDG.E.64 R2, desc[UR4][R8.64]", "LDG.E R2, desc[UR4][R8.64]",
        "LDG.E.U16 R2, desc[UR4][R8.64]", "LDG.E.LTC128B.128 R4, desc[UR4][R8.64]", "STG.E.U8 desc[UR4][R2.64], R4",
        "HGMMA.64x128x16.F32 R88, gdesc[UR20].tnspB, R88", "HMMA.16816.F32 R4, R8, R12, R4", "UTMALDG.2D [UR8], [UR4]",
        "LDSM.16.M88.4 R4, [R2]", "STL [R1], R4", "BAR.SYNC.DEFER_BLOCKING 0x0", "@P1 BRA 0x190", "FFMA R1, R2, R3, R4",
        "HFMA2 R1, R2, R3, R4"]))
    s = kernel_stats.count_instructions(sass, "sass")
    assert s["instructions"] == 15
    assert (s["global loads 128-bit"], s["global loads 64-bit"], s["global loads 32-bit"], s["global loads 16-bit"]) \
        == (2, 1, 1, 1)
    assert s["global load widths"] == "16,32,64,128" and s["global store widths"] == "8"
    assert [s[c] for c in ("wgmma", "mma.sync", "TMA", "shared loads", "local stores", "barriers", "branches",
                           "fp32 arith", "fp16 arith")] == [1] * 9
    assert s["mfma"] == NOT_AVAILABLE
    # Widths the compiled kernels above do not use: Blackwell's 256-bit access, signed bytes and halves.
    wide = "\n".join(f"        /*{i:04x}*/   {op} ;" for i, op in enumerate([
        "LDG.E.ENL2.256 R4, desc[UR4][R8.64]", "LDG.E.S8 R2, desc[UR4][R8.64]", "LDG.E.S16 R2, desc[UR4][R8.64]",
        "STG.E.S16 desc[UR4][R2.64], R4"]))
    w = kernel_stats.count_instructions(wide, "sass")
    assert (w["global loads 256-bit"], w["global loads 8-bit"], w["global loads 16-bit"], w["global stores 16-bit"]) \
        == (1, 1, 1, 1)
    # AMDGCN's global and buffer forms, loads and stores each (gfx942's compile above asserts neither count).
    amd = kernel_stats.count_instructions("\n".join(f"  {op} v[0:3], v[4:5], off" for op in (
        "global_load_dwordx4", "buffer_load_dword", "global_store_dwordx2", "buffer_store_short")), "amdgcn")
    assert (amd["global loads 128-bit"], amd["global loads 32-bit"], amd["global stores 64-bit"],
            amd["global stores 16-bit"], amd["buffer loads"]) == (1, 1, 1, 1, 1)


# --- every instruction statistic against an independent count of the same compile ----------------------
# Read off each language's text with plain string operations, not kernel_stats' tables: (opcode -> class)
# by the documented mnemonic of each instruction, on sm_90 as compiled above.
# Barriers and branches are left out: ptxas adds its own (a WARPSYNC, a loop's BRA), so neither count is
# one PTX instruction per SASS one.
SASS_INDEPENDENT = {"global loads": "LDG", "global stores": "STG", "cp.async": "LDGSTS", "wgmma": "HGMMA",
                    "mma.sync": "HMMA", "shared stores": "STS"}
PTX_INDEPENDENT = {"global loads": "ld.global", "global stores": "st.global", "cp.async": "cp.async.cg.shared.global",
                   "wgmma": "wgmma.mma_async", "mma.sync": "mma.sync", "shared stores": "st.shared"}


def _opcodes(text: str, language: str) -> list[str]:
    """Each instruction's opcode, predicate dropped: SASS lines carry a /*address*/ comment, PTX
    instructions end with ';' and are not directives or labels."""
    ops = []
    for line in text.splitlines():
        line = line.strip()
        if language == "sass":
            if not line.startswith("/*") or "*/" not in line:
                continue
            line = line.split("*/", 1)[1].strip()
        elif not line.endswith(";") or line.startswith((".", "//", "}")):
            continue
        words = [w for w in line.replace(";", " ").split() if not w.startswith("@")]
        if words and words[0][0].isalpha():
            ops.append(words[0].rstrip(","))
    return ops


def _independent(ops: list[str], language: str) -> dict:
    table = SASS_INDEPENDENT if language == "sass" else PTX_INDEPENDENT
    counts = {}
    for field, prefix in table.items():
        if language == "sass":
            counts[field] = sum(1 for op in ops if op.split(".")[0] == prefix)
        else:
            counts[field] = sum(1 for op in ops if op == prefix or op.startswith(prefix + "."))
    for kind, prefix in (("load", table["global loads"]), ("store", table["global stores"])):
        for op in ops:
            if (op.split(".")[0] == prefix) if language == "sass" else op.startswith(prefix + "."):
                if language == "sass":  # LDG.E.128: the width is the numeric suffix, 32 without one
                    width = next((int(p) for p in op.split(".")[1:] if p in ("64", "128", "256")), 32)
                else:  # ld.global.v4.b32: lanes x the last type's bits
                    parts = op.split(".")
                    lanes = next((int(p[1:]) for p in parts if p in ("v2", "v4", "v8")), 1)
                    width = lanes * int("".join(c for c in parts[-1] if c.isdigit()))
                key = f"global {kind}s {width}-bit"
                counts[key] = counts.get(key, 0) + 1
    return counts


def _record_counts(record: dict, keys) -> dict:
    out = {}
    for key in keys:
        if key in ("global loads", "global stores"):
            out[key] = sum(record[f"{key} {w}-bit"] for w in kernel_stats.LOAD_WIDTHS)
        else:
            out[key] = record[key]
    return out


def test_every_instruction_statistic_matches_an_independent_count_in_sass_and_in_ptx(sm90, sm90_mma_v2, tools,
                                                                                         tmp_path):
    """On every stats kernel, with Hopper's MMA and without: each count the record gives equals a count
    taken independently from the same SASS (cuobjdump) and PTX, each width's global loads and stores
    too; and the two languages agree where one PTX instruction is one SASS instruction. A shared-memory
    load counted as a global one (the dot has LDS and LDGSTS, no LDG) fails here."""
    no_tools = kernel_stats.find_tools(dirs=[tmp_path], use_path=False)
    checked = 0
    for kernels in (sm90, sm90_mma_v2):
        for label, (asm, metadata) in kernels.items():
            sass_text, _ = kernel_stats.disassemble(asm["cubin"], tools)
            per_language = {}
            for language, text, record in (("sass", sass_text, kernel_stats.extract(asm, metadata, tools)),
                                           ("ptx", asm["ptx"], kernel_stats.extract(asm, metadata, no_tools))):
                assert record["instructions from"] == language
                ops = _opcodes(text, language)
                assert record["instructions"] == len(ops), (label, language)
                expected = _independent(ops, language)
                widths = {f"global {k}s {w}-bit": 0 for k in ("load", "store") for w in kernel_stats.LOAD_WIDTHS}
                expected = {**widths, **expected}
                assert _record_counts(record, expected) == expected, (label, language)
                per_language[language] = expected
                checked += 1
            assert per_language["sass"] == per_language["ptx"], label
    assert checked == 12
    dot = _independent(_opcodes(kernel_stats.disassemble(sm90["dot"][0]["cubin"], tools)[0], "sass"), "sass")
    assert dot["global loads"] == 0 and dot["cp.async"] > 0  # the case the mutant needs: loads via shared memory
    assert kernel_stats.extract(*sm90["dot"], tools)["global load widths"] == "none"
