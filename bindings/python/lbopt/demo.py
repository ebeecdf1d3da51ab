"""What 4-bit optimizer states buy: a character-level transformer language model trained on real English text
with torch.optim.AdamW (fp32 states), lbopt 8-bit and lbopt 4-bit (and torchao's AdamW4bit when installed), each
with a linear warm-up then cosine decay that changes the lr on every step.

    python -m lbopt.demo                      # default size: a few minutes on 2 CPU cores
    python -m lbopt.demo --steps 600 --d-model 256 --optimizers fp32,lbopt-4bit --device cuda

The text is the Debian `fortunes` corpus (apt-get install fortunes), or any text file given with --corpus.
Each optimizer trains in a fresh process (so its peak memory is its own) from the same seed and data. At the end
a table, loss curves and a state-memory chart are written to the results folder, whose path is printed.
"""
import argparse
import glob
import json
import math
import multiprocessing
import os
import pathlib
import queue as queue_module
import resource
import time

FORTUNES = "/usr/share/games/fortunes"
OPTIMIZERS = ("fp32", "lbopt-8bit", "lbopt-4bit", "torchao-4bit", "lbopt-muon4bit")
DEFAULT = ("fp32", "lbopt-8bit", "lbopt-4bit")  # and torchao-4bit where torchao is installed
LABELS = {"fp32": "torch AdamW (fp32)", "lbopt-8bit": "lbopt AdamW8bit", "lbopt-4bit": "lbopt AdamW4bit",
          "torchao-4bit": "torchao AdamW4bit", "lbopt-muon4bit": "lbopt Muon4bit + AdamW4bit"}
MUON_LR = 0.02  # Muon's lr for the hidden matrices (its authors'); the other params take --lr


def load_corpus(path):
    """The text of one file, or of every fortune file (the plain-text ones, without the .dat indexes)."""
    if path:
        return pathlib.Path(path).read_text(encoding="utf-8", errors="replace")
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*")) if os.path.isfile(f) and "." not in
                   os.path.basename(f))
    if not files:
        raise SystemExit(f"no corpus: install the Debian package 'fortunes' (text under {FORTUNES}) or pass --corpus")
    return "\n".join(pathlib.Path(f).read_text(encoding="utf-8", errors="replace") for f in files)


def build_model(torch, vocab, args):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(args.d_model), nn.LayerNorm(args.d_model)
            self.attn = nn.MultiheadAttention(args.d_model, args.heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(args.d_model, 4 * args.d_model), nn.GELU(),
                                     nn.Linear(4 * args.d_model, args.d_model))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class CharLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, args.d_model)
            self.pos = nn.Embedding(args.context, args.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln = nn.LayerNorm(args.d_model)
            self.head = nn.Linear(args.d_model, vocab)

        def forward(self, idx):
            t = idx.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), diagonal=1)
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    return CharLM()


def lr_factor(step, steps):
    """The lr schedule's factor at a step: a linear warm-up over the first tenth, then cosine decay to 10% of the
    peak (a new lr on every step)."""
    warm = max(1, steps // 10)
    if step < warm:
        return (step + 1) / warm
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def sample_batch(torch, src, g, args, device):
    """args.batch random windows of args.context characters of src and the characters after them."""
    ix = torch.randint(len(src) - args.context - 1, (args.batch,), generator=g)
    x = torch.stack([src[i: i + args.context] for i in ix])
    y = torch.stack([src[i + 1: i + args.context + 1] for i in ix])
    return x.to(device), y.to(device)


def make_optimizers(torch, name, model, lr):
    """The optimizers of a run: one, or Muon for the hidden matrices and AdamW for the other params."""
    params = model.parameters()
    if name == "fp32":
        return [torch.optim.AdamW(params, lr=lr, weight_decay=0.01)]
    if name == "torchao-4bit":
        from torchao.optim import AdamW4bit

        return [AdamW4bit(params, lr=torch.tensor(lr), weight_decay=0.01)]  # a tensor lr: no recompile per lr
    import lbopt.torch as lt

    if name == "lbopt-muon4bit":
        muon, rest = lt.muon_param_groups(model)
        return [lt.Muon4bit(muon, lr=MUON_LR, weight_decay=0.01), lt.AdamW4bit(rest, lr=lr, weight_decay=0.01)]
    return [{"lbopt-8bit": lt.AdamW8bit, "lbopt-4bit": lt.AdamW4bit}[name](params, lr=lr, weight_decay=0.01)]


def state_bytes(torch, opts):
    """Bytes of every tensor in the optimizers' states (quantized codes and scales included; torchao's state
    subclasses count their inner tensors)."""
    total = 0
    for st in (st for opt in opts for st in opt.state.values()):
        for v in st.values():
            if not torch.is_tensor(v):
                continue
            inner = getattr(v, "__tensor_flatten__", None)
            parts = [getattr(v, a) for a in inner()[0]] if inner else [v]
            total += sum(t.numel() * t.element_size() for t in parts)
    return total


def train(name, args, queue):
    """One optimizer's run, in its own process; puts a result dict on queue."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if name.startswith("lbopt"):
        import lbopt

        lbopt.set_num_threads(args.threads)
    text = load_corpus(args.corpus)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text[: args.max_chars]], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    device = torch.device(args.device)
    model = build_model(torch, len(chars), args).to(device)
    opts = make_optimizers(torch, name, model, args.lr)
    scheds = [torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, args.steps)) for opt in opts]
    gen = torch.Generator().manual_seed(args.seed + 1)

    def batch(src, g):
        return sample_batch(torch, src, g, args, device)

    val_gen = torch.Generator().manual_seed(args.seed + 2)
    val_batches = [batch(val_data, val_gen) for _ in range(args.val_batches)]

    def evaluate():
        model.eval()
        with torch.no_grad():
            losses = [torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                      for x, y in val_batches]
        model.train()
        return sum(losses) / len(losses)

    curve, val_curve, step_times, opt_times = [], [], [], []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in tqdm(range(args.steps), desc=LABELS[name], position=0, leave=True, mininterval=1.0):
        x, y = batch(train_data, gen)
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        sync()
        t1 = time.perf_counter()
        for opt in opts:
            opt.step()
        sync()
        t2 = time.perf_counter()
        for sched in scheds:
            sched.step()
        step_times.append(t2 - t0)
        opt_times.append(t2 - t1)
        curve.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            val_curve.append((step + 1, evaluate()))
    skip = min(2, len(step_times) - 1)  # first steps include allocation and compilation
    queue.put({
        "name": name,
        "train_curve": curve,
        "val_curve": val_curve,
        "val_loss": val_curve[-1][1],
        "state_bytes": state_bytes(torch, opts),
        "params": sum(p.numel() for p in model.parameters()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_ms": 1e3 * sum(step_times[skip:]) / len(step_times[skip:]),
        "opt_step_ms": 1e3 * sum(opt_times[skip:]) / len(opt_times[skip:]),
    })


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        steps, losses = zip(*r["val_curve"])
        ax1.plot(steps, losses, marker="o", markersize=3, label=LABELS[r["name"]])
    ax1.set_xlabel("step")
    ax1.set_ylabel("validation loss (nats/char)")
    ax1.set_title("char-level transformer, warm-up + cosine lr")
    ax1.legend()
    ax1.grid(alpha=0.3)
    names = [LABELS[r["name"]] for r in results]
    mb = [r["state_bytes"] / 2**20 for r in results]
    bars = ax2.bar(names, mb, color=["#777777", "#4c72b0", "#55a868", "#c44e52", "#8172b2"][: len(results)])
    for b, r in zip(bars, results):
        ax2.annotate(f"{r['state_bytes'] / r['params']:.2f} B/param", (b.get_x() + b.get_width() / 2, b.get_height()),
                     ha="center", va="bottom", fontsize=9)
    ax2.set_ylabel("optimizer state (MiB)")
    ax2.set_title("optimizer state memory")
    ax2.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(results):
    base = next((r for r in results if r["name"] == "fp32"), None)
    lines = ["| optimizer | val loss | vs fp32 | state MiB | B/param | peak RSS MiB | step ms | opt step ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        gap = f"{100 * (r['val_loss'] / base['val_loss'] - 1):+.2f}%" if base else "-"
        lines.append(f"| {LABELS[r['name']]} | {r['val_loss']:.4f} | {gap} | {r['state_bytes'] / 2**20:.2f} | "
                     f"{r['state_bytes'] / r['params']:.3f} | {r['peak_rss_mb']:.0f} | {r['step_ms']:.1f} | "
                     f"{r['opt_step_ms']:.2f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m lbopt.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--optimizers", default=None,
                    help=f"comma-separated, from {','.join(OPTIMIZERS)} (default: {','.join(DEFAULT)}, and "
                         f"torchao-4bit where torchao is installed)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--val-batches", type=int, default=8)
    ap.add_argument("--max-chars", type=int, default=2_000_000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", default=None, help="a text file (default: the Debian fortunes corpus)")
    ap.add_argument("--out", default="results/demo", help="results folder")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    names = args.optimizers.split(",") if args.optimizers else list(DEFAULT)
    if args.optimizers is None:
        try:
            import torchao.optim  # noqa: F401

            names.append("torchao-4bit")
        except ImportError:
            pass
    unknown = [n for n in names if n not in OPTIMIZERS]
    if unknown:
        raise SystemExit(f"unknown optimizers {unknown}; choose from {OPTIMIZERS}")
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    results = []
    for name in names:
        queue = ctx.Queue()
        proc = ctx.Process(target=train, args=(name, args, queue))
        proc.start()
        result = None
        while result is None and (proc.is_alive() or not queue.empty()):
            try:
                result = queue.get(timeout=1.0)
            except queue_module.Empty:  # still training
                pass
        proc.join()
        if result is None:
            raise SystemExit(f"{name}: training process failed with exit code {proc.exitcode}")
        results.append(result)
    md = table(results)
    print("\n" + md)
    (out / "table.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    plot(results, out / "demo.png")
    print(f"\nresults: {out} (table.md, results.json, demo.png)")
    return results


if __name__ == "__main__":
    main()
