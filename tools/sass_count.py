"""Static SASS instructions per element of the CUDA step's full-block path, per optimizer, state kind and param
dtype (grads of the same dtype), with the registers, spills and theoretical occupancy of the library's step kernel:
a proxy of the step's instruction cost that any machine with nvcc can measure (it is not the executed count a
profiler gives, which also counts the branches each warp takes and the per-CTA set-up once per CTA).

tools/sass_probe.cu instantiates step_block<..., FULL = true> in one grid-stride loop per probe, dtypes fixed at
compile time; this script compiles it for one architecture, finds each probe's loop (the widest backward branch)
and counts its instructions without NOPs. Per element: the loop's count x 32 lanes / the block's elements.

    python3 tools/sass_count.py [--arch 90] [--wide] [--encode-in-x] [--encode8-buckets] [--fp8-cvt] [--cuobjdump PATH]
"""
import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
OPTIMIZERS = {"AdamW": "AdamW", "Sgd": "SGD", "Lion": "Lion", "AdEMAMix": "AdEMAMix", "Muon": "Muon"}
KINDS = {"Kind4Bit": ("4-bit", 128), "Kind8Bit": ("8-bit", 256), "KindFp8": ("FP8", 256), "KindFp32": ("fp32", 256)}
DTYPES = {"0": "fp32", "1": "bf16"}
REGS_PER_SM, MAX_WARPS_PER_SM, WARPS_PER_CTA = 65536, 64, 8  # sm_80 and sm_90; kThreads = 256


def find_cuobjdump(given):
    """cuobjdump from the argument, PATH, the CUDA toolkit beside nvcc, or a pip wheel (nvidia-cuda-cuobjdump, or
    the copy triton bundles)."""
    if given:
        return given
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    candidates = [pathlib.Path(nvcc).parent / "cuobjdump"] if nvcc else []
    for site in map(pathlib.Path, sys.path):
        candidates += [site / "nvidia" / "cuda_cuobjdump" / "bin" / "cuobjdump",
                       site / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump"]
    for c in candidates:
        if c.is_file():
            return str(c)
    sys.exit("sass_count: no cuobjdump (pip install nvidia-cuda-cuobjdump, or pass --cuobjdump)")


def compile_probes(arch, options, out):
    cmd = ["nvcc", "-std=c++17", "-cubin", f"-arch=sm_{arch}", "--fmad=false", "-O3", "-I", str(ROOT / "abi"),
           "-I", str(ROOT), "-DLBOPT_BUILDING", "-DLBOPT_WITH_CUDA=1",
           f"-DLBOPT_CUDA_WIDE_STEP={int(options.wide)}", f"-DLBOPT_CUDA_ENCODE_IN_X={int(options.encode_in_x)}",
           f"-DLBOPT_CUDA_ENCODE8_BUCKETS={int(options.encode8_buckets)}", f"-DLBOPT_CUDA_FP8_CVT={int(options.fp8_cvt)}",
           "-o", str(out), str(ROOT / "tools" / "sass_probe.cu")]
    subprocess.run(cmd, check=True)


def functions(sass):
    """{mangled name: [(address, instruction text)]} of a cuobjdump -sass listing."""
    out, current = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def loop_body(code):
    """The instructions of the widest loop: from a backward branch's target to the branch."""
    widest = None
    for address, text in code:
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < address:
            span = (int(m.group(1), 16), address)
            if widest is None or span[1] - span[0] > widest[1] - widest[0]:
                widest = span
    if widest is None:
        return []
    return [t for a, t in code if widest[0] <= a <= widest[1] and not t.endswith("NOP")]


def resources(listing):
    """{mangled name: (registers, stack bytes, local bytes)} of cuobjdump -res-usage."""
    out, name = {}, None
    for line in listing.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", line)
        if m and name:
            out[name] = tuple(int(x) for x in m.groups())
    return out


def occupancy(regs):
    per_warp = -(-regs * 32 // 256) * 256
    ctas = (REGS_PER_SM // per_warp) // WARPS_PER_CTA
    return min(ctas * WARPS_PER_CTA, MAX_WARPS_PER_SM) / MAX_WARPS_PER_SM


def demangled(names):
    text = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, text.splitlines()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="90")
    ap.add_argument("--wide", action="store_true", help="the step shaped for bandwidth (gpu_wide_step)")
    ap.add_argument("--encode-in-x", action="store_true", help="the 4-bit encode in x (gpu_encode_in_x)")
    ap.add_argument("--encode8-buckets", action="store_true",
                    help="the 8-bit encode by buckets of the float's bits (gpu_encode8_buckets)")
    ap.add_argument("--fp8-cvt", action="store_true", help="the FP8 encode by the conversion instruction (gpu_fp8_cvt)")
    ap.add_argument("--cuobjdump")
    args = ap.parse_args()
    cuobjdump = find_cuobjdump(args.cuobjdump)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = pathlib.Path(tmp) / "probes.cubin"
        compile_probes(args.arch, args, cubin)
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True,
                               check=True).stdout
    code, res = functions(sass), resources(usage)
    names = demangled(list(code))
    kernels = {}  # (optimizer, kind) -> the library's step kernel's resources
    for mangled, name in names.items():
        m = re.search(r"step_kernel<lbopt::(\w+), lbopt::(\w+)>", name)
        if m:
            kernels[m.groups()] = res.get(mangled)
    print(f"sm_{args.arch}, {'wide step' if args.wide else 'step'}, 4-bit encode "
          f"{'in x' if args.encode_in_x or args.wide else 'by division'}, 8-bit "
          f"encode {'by buckets' if args.encode8_buckets else 'by search'}, FP8 encode "
          f"{'by the conversion instruction' if args.fp8_cvt else 'in software'}")
    print("| optimizer | kind | params | loop SASS | per element | MUFU.RCP | CALL | step_kernel registers | "
          "spilled (stack, local bytes) | occupancy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for mangled, name in names.items():
        m = re.search(r"sass_probe<lbopt::(\w+), lbopt::(\w+), \(lbopt::Dtype\)(\d)>", name)
        if not m:
            continue
        opt, kind, dtype = m.groups()
        body = loop_body(code[mangled])
        regs, stack, local = kernels[(opt, kind)]
        label, block = KINDS[kind]
        rows.append(((list(OPTIMIZERS).index(opt), list(KINDS).index(kind), dtype),
                     f"| {OPTIMIZERS[opt]} | {label} | {DTYPES[dtype]} | {len(body)} | {len(body) * 32 / block:.1f} "
                     f"| {sum(t.startswith('MUFU.RCP') for t in body)} | {sum('CALL' in t for t in body)} | {regs} "
                     f"| {stack}, {local} | {occupancy(regs):.0%} |"))
    for _, row in sorted(rows):
        print(row)


if __name__ == "__main__":
    main()
