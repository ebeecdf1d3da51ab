"""What each rank runs in tests/python/test_distributed.py: torch.distributed on gloo, spawned processes on this
machine (loopback only). run(case, world, ...) spawns `world` ranks of case(rank, world, out_dir, *args); each
rank writes its results with torch.save to out_dir/<rank>.pt, which run() returns as a list."""
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import lbopt.torch as LT


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, case, out_dir, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.save(case(rank, world, *args), os.path.join(out_dir, f"{rank}.pt"))
    dist.barrier()  # every rank's results are written
    # Leave without tearing the process group down: gloo's threads can abort a process in its exit path
    # ("terminate called without an active exception", seen once in about 60 spawned runs here) after the work
    # is done. A case that raises takes spawn's normal error path instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(case, world, out_dir, *args):
    out_dir = str(out_dir)
    mp.spawn(_entry, args=(world, _free_port(), case, out_dir, args), nprocs=world)
    return [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world)]


def mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


# ---- the test model: a small transformer-like stack whose matrices exceed min_quant_size ---------------------

# HIDDEN = 100: the MLP matrices' 1600-element shards on 2 ranks cut a block; ALIGNED_HIDDEN = 128: every
# quantized shard holds whole blocks of 256
VOCAB, DIM, HIDDEN, ALIGNED_HIDDEN, SEQ, BATCH = 64, 32, 100, 128, 16, 32


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attn = nn.Linear(DIM, DIM)
        self.up = nn.Linear(DIM, hidden)
        self.down = nn.Linear(hidden, DIM)

    def forward(self, x):
        h = self.norm(x)
        w = torch.softmax(h @ self.attn(h).transpose(1, 2) / DIM ** 0.5, dim=-1)
        x = x + w @ h
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(hidden), Block(hidden)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_model(shard_world=None, hidden=HIDDEN):
    torch.manual_seed(0)
    model = TinyLM(hidden)
    if shard_world:
        from torch.distributed.fsdp import fully_shard

        m = mesh(shard_world)
        for b in model.blocks:
            fully_shard(b, mesh=m)
        fully_shard(model, mesh=m)
    return model


def batch(step):
    """Sequences that follow a rule (next = 5 * token + 3 mod VOCAB) 70% of the time, else a random token: a loss
    the model lowers from ln 64 = 4.2 towards the noise floor of about 1.8, never near 0, where relative
    differences would mean nothing."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = [torch.randint(0, VOCAB, (BATCH,), generator=g)]
    for _ in range(SEQ):
        noise = torch.randint(0, VOCAB, (BATCH,), generator=g)
        ids.append(torch.where(torch.rand(BATCH, generator=g) < 0.7, (5 * ids[-1] + 3) % VOCAB, noise))
    ids = torch.stack(ids, 1)
    return ids[:, :-1], ids[:, 1:]


def make_opt(model, kind):
    # min_quant_size 1024: the 100x32 and 32x100 matrices (3200 elements; 1600 per shard on 2 ranks, which cuts
    # a block) and the embedding and head (2048) are quantized, norms and biases keep fp32 states
    return LT.LowBitAdamW(model.parameters(), lr=2e-3, state_kind=kind, min_quant_size=1024)


def train(model, opt, steps, start=0):
    """steps steps from step `start` with a cosine lr computed from the step, so a resumed run needs no
    scheduler state."""
    losses, times = [], []
    for step in range(start, start + steps):
        for group in opt.param_groups:
            group["lr"] = 1e-3 * (1 + math.cos(math.pi * step / 200))
        x, y = batch(step)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
        opt.zero_grad()
        losses.append(loss.item())
    return losses, times


def full_params(model):
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def kinds_of(opt, model):
    return {n: opt.state[p]["state_kind"] for n, p in model.named_parameters() if p in opt.state}


# ---- cases -----------------------------------------------------------------------------------------------------

def fsdp_train(rank, world, kinds, steps, hidden=HIDDEN):
    """Every rank sees the same batches, so the averaged gradients equal one process's exactly."""
    out = {}
    for kind in kinds:
        model = make_model(world, hidden)
        opt = make_opt(model, kind)
        losses, times = train(model, opt, steps)
        local = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}
        out[kind] = {"losses": losses, "params": full_params(model), "kinds": kinds_of(opt, model),
                     "local_shapes": local, "step_time": sorted(times)[len(times) // 2]}
    return out


def eligibility_and_empty_shard(rank, world):
    """A param of 5120 elements (above min_quant_size 4096) whose shards have 2560, and a [1, 5000] param whose
    second shard is empty."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.ParameterDict({"wide": nn.Parameter(torch.randn(40, 128)),
                              "one_row": nn.Parameter(torch.randn(1, 5000))})
    fully_shard(model, mesh=mesh(world))
    opt = LT.AdamW4bit(model.parameters(), lr=1e-2)
    for _ in range(3):
        (model["wide"].sum() * 0 + (model["wide"] ** 2).sum() + (model["one_row"] ** 2).sum()).backward()
        opt.step()
        opt.zero_grad()
    return {"kinds": kinds_of(opt, model), "params": full_params(model),
            "local_numel": {n: p.to_local().numel() for n, p in model.named_parameters()},
            "codes_numel": {n: opt.state[p]["exp_avg_codes"].numel() for n, p in model.named_parameters()}}


def refused_dtensors(rank, world):
    """A Partial param and a param whose local shard is not dense: each refused with a message naming it, and
    the good param in the same group is left untouched."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    m = mesh(world)
    torch.manual_seed(rank)
    good = nn.Parameter(DTensor.from_local(torch.randn(50, 100), m, [Shard(0)]))
    partial = nn.Parameter(DTensor.from_local(torch.randn(100), m, [Partial()]))
    gapped = nn.Parameter(DTensor.from_local(torch.randn(20, 80)[:, ::2], m, [Shard(0)], run_check=False))
    out = {}
    for name, bad in (("partial", partial), ("gapped", gapped)):
        opt = LT.AdamW4bit([("good", good), (name, bad)], lr=1e-2)
        for p in (good, bad):
            p.grad = DTensor.from_local(torch.ones_like(p.to_local()), m, p.placements, run_check=False)
        before = good.to_local().clone()
        try:
            opt.step()
            out[name] = None
        except Exception as e:
            out[name] = (type(e).__name__, str(e))
        out[name + "_untouched"] = torch.equal(good.to_local(), before) and not opt.state
    # a sharded checkpoint of a [100, 100] param offered to a [44, 100] one (both 4-bit)
    opt = LT.AdamW4bit([("good", good)], lr=1e-2)
    good.grad = DTensor.from_local(torch.ones_like(good.to_local()), m, good.placements, run_check=False)
    opt.step()
    other = nn.Parameter(DTensor.from_local(torch.randn(22, 100), m, [Shard(0)]))
    other_opt = LT.AdamW4bit([("other", other)], lr=1e-2)
    try:
        other_opt.load_state_dict(opt.state_dict())
        out["reshaped"] = None
    except Exception as e:
        out["reshaped"] = (type(e).__name__, str(e))
    out["reshaped_untouched"] = not other_opt.state
    return out


def tensor_parallel(rank, world):
    """Column-sharded (Shard(1)) weight and a replicated bias stepped with fp32 states: the full weight equals
    one process's step of the plain tensors bit for bit."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    m = mesh(world)
    torch.manual_seed(0)
    w0, b0 = torch.randn(64, 96), torch.randn(96)
    grads = [(torch.randn(64, 96), torch.randn(96)) for _ in range(4)]
    w = nn.Parameter(distribute_tensor(w0.clone(), m, [Shard(1)]))  # distribute_tensor may keep the memory
    b = nn.Parameter(distribute_tensor(b0.clone(), m, [Replicate()]))
    opt = LT.AdamW([w, b], lr=1e-2)
    for gw, gb in grads:
        w.grad = distribute_tensor(gw.clone(), m, [Shard(1)])
        b.grad = distribute_tensor(gb.clone(), m, [Replicate()])
        opt.step()
    # 4-bit states step a column shard too; their sharded checkpoint needs dim-0 sharding, so state_dict() refuses
    q = nn.Parameter(distribute_tensor(torch.randn(64, 96), m, [Shard(1)]))
    q.grad = distribute_tensor(torch.randn(64, 96), m, [Shard(1)])
    qopt = LT.AdamW4bit([("q", q)], lr=1e-2)
    qopt.step()
    try:
        qopt.state_dict()
        refused = None
    except ValueError as e:
        refused = str(e)
    return {"w": w.full_tensor(), "b": b.full_tensor(), "w0": w0, "b0": b0, "grads": grads,
            "local_w": tuple(w.to_local().shape), "q_kind": qopt.state[q]["state_kind"], "q_refused": refused}


def dcp_save(rank, world, kinds, path, steps, more):
    """Per kind: train `steps`, save model and optimizer with DCP under path/<kind>, then train `more` without
    the save (the reference a resumed run must reproduce). world None: a plain model (no FSDP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out = {}
    for kind in kinds:
        model = make_model(world)
        opt = make_opt(model, kind)
        train(model, opt, steps)
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(path, kind))
        losses, _ = train(model, opt, more, start=steps)
        out[kind] = {"losses": losses, "params": full_params(model)}
    return out


def dcp_load(rank, world, kinds, path, steps, more):
    """Per kind: a fresh model and optimizer on this mesh (world None: a plain model), loaded from path/<kind>,
    trained `more` from step `steps`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    out = {}
    for kind in kinds:
        model = make_model(world)
        opt = make_opt(model, kind)
        model_sd, optim_sd = get_state_dict(model, opt)  # the template, on this mesh
        sd = {"model": model_sd, "optim": optim_sd}
        dcp.load(sd, checkpoint_id=os.path.join(path, kind))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        steps_loaded = {opt.state[p]["step"] for p in model.parameters()}
        losses, _ = train(model, opt, more, start=steps)
        out[kind] = {"losses": losses, "params": full_params(model), "steps": steps_loaded}
    return out


def dcp_load_plain(rank, world, *args):
    """dcp_load into a plain model, in a rank of its own (one process: MKL's environment is read at its start)."""
    return dcp_load(rank, None, *args)


def fsdp_offload(rank, world, kind, steps):
    """FSDP2's shards stepped by CPUOffload and by the same optimizer on the shards: the same params, the same
    state dict (DTensor states of the same placements), and a checkpoint of one that resumes in the other."""
    from lbopt.offload import CPUOffload

    models = [make_model(world), make_model(world)]
    opts = [make_opt(models[0], kind),
            CPUOffload(models[1].parameters(), LT.LowBitAdamW, lr=2e-3, state_kind=kind, min_quant_size=1024)]
    for model, opt in zip(models, opts):
        train(model, opt, steps)
    plain, offloaded = (o.state_dict() for o in opts)
    same_states = all(
        type(v) is type(offloaded["state"][i][k]) and
        (torch.equal(v.full_tensor(), offloaded["state"][i][k].full_tensor()) if hasattr(v, "full_tensor")
         else (torch.equal(v, offloaded["state"][i][k]) if torch.is_tensor(v) else v == offloaded["state"][i][k]))
        for i, st in plain["state"].items() for k, v in st.items())
    opts[0].load_state_dict(offloaded)  # the offloaded optimizer's checkpoint, resumed on the shards
    losses = [train(model, opt, 3, start=steps)[0] for model, opt in zip(models, opts)]
    return {"params": [full_params(m) for m in models], "same_states": same_states, "losses": losses,
            "local_types": sorted({type(o.host).__name__ for o in opts[1]._offloaded.values()})}


# ---- faults: a rank killed in a step or in a save, and the job restarted ---------------------------------------

def _latest_complete(path):
    """The last step whose checkpoint under path is complete: DCP writes a checkpoint's .metadata last, on the
    coordinator, once every rank's data is written, so a directory without it is a save that did not finish."""
    done = [int(d.split("-")[1]) for d in os.listdir(path) if os.path.exists(os.path.join(path, d, ".metadata"))]
    return max(done, default=0)


def resumable_train(rank, world, kinds, path, total, every, kill=None):
    """Train the whole-block FSDP2 model with each of `kinds` in lockstep to step `total`, saving each model and
    optimizer with DCP to path/<kind>/step-N every `every` steps, after resuming each from its last complete
    checkpoint (as a job restarted by torchrun --max-restarts resumes). kill = (step, rank, where): that rank
    SIGKILLs itself inside the first kind's optimizer.step() of that step (where "step"), or while writing the
    last kind's checkpoint of that step (where "save": after its data, before the checkpoint's metadata)."""
    import signal

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    class DyingWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            written = super().write_data(plan, planner)
            written.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    dying = kill is not None and kill[1] == rank
    now = {"step": 0}
    runs = []
    for kind in kinds:
        os.makedirs(os.path.join(path, kind), exist_ok=True)
        model = make_model(world, ALIGNED_HIDDEN)
        opt = make_opt(model, kind)
        start = _latest_complete(os.path.join(path, kind))
        if start:
            model_sd, optim_sd = get_state_dict(model, opt)
            sd = {"model": model_sd, "optim": optim_sd}
            dcp.load(sd, checkpoint_id=os.path.join(path, kind, f"step-{start}"))
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        runs.append({"kind": kind, "model": model, "opt": opt, "start": start, "losses": []})
    if dying and kill[2] == "step":
        runs[0]["opt"].register_step_pre_hook(
            lambda *_: os.kill(os.getpid(), signal.SIGKILL) if now["step"] == kill[0] else None)
    for step in range(min(r["start"] for r in runs), total):
        now["step"] = step
        for r in runs:
            if step < r["start"]:
                continue
            r["losses"] += train(r["model"], r["opt"], 1, start=step)[0]
            if (step + 1) % every == 0 and step + 1 < total:
                model_sd, optim_sd = get_state_dict(r["model"], r["opt"])
                target = os.path.join(path, r["kind"], f"step-{step + 1}")
                last = dying and kill[2] == "save" and kill[0] == step + 1 and r is runs[-1]
                dcp.save({"model": model_sd, "optim": optim_sd},
                         storage_writer=DyingWriter(target) if last else FileSystemWriter(target))
    return {r["kind"]: {"start": r["start"], "losses": r["losses"], "params": full_params(r["model"])} for r in runs}
