"""The sharded test model (tests/python/distributed_cases.py: a 2-block transformer of about 30K params whose
MLP shards cut a block) on 2 gloo ranks against one process, per state kind, over 200 steps: the largest relative
loss difference at any step, and the median opt.step() alone, one thread per rank.

    LBOPT_LIBRARY=build/liblbopt.so.0 python3 bench/bench_distributed.py
"""
import pathlib
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root / "tests" / "python"), str(root / "bindings" / "python")]

import torch  # noqa: E402

import distributed_cases as cases  # noqa: E402
import lbopt  # noqa: E402

KINDS = ["fp32", "4bit", "8bit", "fp8"]


def main():
    two = cases.run(cases.fsdp_train, 2, tempfile.mkdtemp(), KINDS, 200)
    torch.set_num_threads(1)
    print(f"CPU kernels: {lbopt.build_info()['cpu_kernels']}; torch {torch.__version__}")
    print("| state kind | largest loss difference | 1 process (ms) | 2 ranks, FSDP2 (ms, slower rank) | ratio |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        model = cases.make_model()
        losses, times = cases.train(model, cases.make_opt(model, kind), 200)
        rel = max(abs(a - b) / a for r in two for a, b in zip(losses, r[kind]["losses"]))
        one = sorted(times)[len(times) // 2] * 1e3
        both = max(r[kind]["step_time"] for r in two) * 1e3
        print(f"| {kind} | {rel:.3%} | {one:.3f} | {both:.3f} | {both / one:.2f} |")


if __name__ == "__main__":
    main()
