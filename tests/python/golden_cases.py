"""Golden checkpoints: optimizer state dicts saved by a released lbopt, which every later version must load and
continue bit-identically (tests/python/test_golden_checkpoints.py).

    python3 tests/python/golden_cases.py    # writes tests/data/checkpoints/<lbopt version>/

writes, for the version of the library it runs against:
  * plain.pt: per optimizer and state kind, a small model's params and optimizer.state_dict() after 3 steps
    (one process, no sharding), and the grads of steps 1-5;
  * sharded/<kind>/: a distributed checkpoint (torch.distributed.checkpoint) of the model and AdamW states
    saved under FSDP2 on 2 ranks after SAVED_AT steps (distributed_cases.dcp_save);
  * expected.json: digests of the params after each step of the resumed runs, and the sharded runs' losses.
A release adds its own folder when its format changes; the folders of earlier releases are never rewritten.
"""
import copy
import hashlib
import json
import pathlib
import sys

import torch
from torch import nn

if __name__ == "__main__":  # run as a script: the package from the source tree, beside distributed_cases
    sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[2] / "bindings" / "python"),
                    str(pathlib.Path(__file__).resolve().parent)]

import lbopt.torch as LT  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "checkpoints"
KINDS = ("4bit", "8bit", "fp8", "fp32")
SAVED_AT, MORE = 3, 2              # plain: steps before the save, steps after it
SHARDED_AT, SHARDED_MORE = 10, 5   # sharded: the same, with distributed_cases' model and batches

# Each optimizer with every state it can keep: AdamW with AMSGrad (3 states), SGD with momentum, Lion, AdEMAMix.
# The codes round to nearest, as every optimizer's did when the first checkpoints were saved (0.3): a checkpoint
# continues bit-identically under the rounding it was made with.
NEAREST = dict(state_stochastic_round=False)
OPTIMIZERS = {
    "adamw": lambda params, kind: LT.LowBitAdamW(params, lr=1e-2, amsgrad=True, state_kind=kind),
    "sgd": lambda params, kind: LT.LowBitSGD(params, lr=1e-2, momentum=0.9, state_kind=kind, **NEAREST),
    "lion": lambda params, kind: LT.LowBitLion(params, lr=1e-3, state_kind=kind, **NEAREST),
    "ademamix": lambda params, kind: LT.LowBitAdEMAMix(params, lr=1e-2, state_kind=kind, **NEAREST),
}


class Net(nn.Module):
    """A 4608-element matrix (quantized at the default min_quant_size of 4096), a bias (fp32 states) and a
    channels_last convolution (4200 elements: states in a memory order other than row-major)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(72, 64)
        self.conv = nn.Conv2d(6, 28, 5)
        self.to(memory_format=torch.channels_last)


def grads(model, steps):
    """The grads of steps 1..steps, as {step: {name: tensor}}."""
    g = torch.Generator().manual_seed(7)
    return {s: {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
            for s in range(1, steps + 1)}


def run(model, opt, grads_by_step, steps):
    """The given steps, each with its grads; returns the digest of the params after each."""
    digests = []
    for s in steps:
        for n, p in model.named_parameters():
            p.grad = grads_by_step[s][n].clone()
        opt.step()
        digests.append(digest(model))
    return digests


def digest(model):
    h = hashlib.sha256()
    for n, p in model.named_parameters():
        h.update(n.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def resume(entry, key, grads_by_step):
    """A fresh model and optimizer loaded from a saved entry and stepped on: the digests of its params."""
    model = Net()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(entry["params"][n])
    name, kind = key.split("-")
    opt = OPTIMIZERS[name](model.parameters(), kind)
    opt.load_state_dict(entry["optim"])
    return run(model, opt, grads_by_step, range(SAVED_AT + 1, SAVED_AT + MORE + 1))


def write_plain(out):
    """The entries, and as what every later version must reproduce the digests of their resumption here, which
    equal those of the uninterrupted run where the states are row-major (the channels_last convolution's
    quantized states are re-blocked into row-major order by a checkpoint since lbopt 0.4)."""
    model = Net()
    g = grads(model, SAVED_AT + MORE)
    entries, expected = {}, {}
    for name, make in OPTIMIZERS.items():
        for kind in KINDS:
            model = Net()
            opt = make(model.parameters(), kind)
            run(model, opt, g, range(1, SAVED_AT + 1))
            key = f"{name}-{kind}"
            entries[key] = copy.deepcopy({"params": {n: p.detach() for n, p in model.named_parameters()},
                                          "optim": opt.state_dict()})  # not the live tensors
            expected[key] = resume(entries[key], key, g)
    torch.save({"grads": g, "entries": entries}, out / "plain.pt")
    return expected


def write_sharded(out):
    import distributed_cases as cases

    path = out / "sharded"
    ref = cases.run(cases.dcp_save, 2, out / "ranks", list(KINDS), str(path), SHARDED_AT, SHARDED_MORE)[0]
    for f in (out / "ranks").iterdir():
        f.unlink()
    (out / "ranks").rmdir()
    return {kind: {"losses": ref[kind]["losses"],
                   "params": {n: hashlib.sha256(p.contiguous().numpy().tobytes()).hexdigest()
                              for n, p in ref[kind]["params"].items()}} for kind in KINDS}


def main():
    import lbopt

    out = DATA / lbopt.version()
    out.mkdir(parents=True, exist_ok=False)
    (out / "ranks").mkdir()
    expected = {"version": lbopt.version(), "plain": write_plain(out), "sharded": write_sharded(out)}
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
