"""lbopt.torch on a CUDA device, from user code: every optimizer class steps a model (channels_last convs, bf16
and fp32 params) on the GPU and must give the CPU's params and states bit for bit, with an lr that changes every
step; GradScaler's skipped steps write nothing; a CUDA state dict resumes on the CPU. Skipped without a GPU (CI
has none; bench/gpu_run.sh runs these on a lent one)."""
import copy

import pytest
import torch

import lbopt.torch as lt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

CLASSES = ["AdamW4bit", "AdamW8bit", "AdamWFp8", "AdamW", "Adam4bit", "SGD4bit", "SGD8bit", "SGDFp8", "SGD",
           "Lion4bit", "Lion8bit", "LionFp8", "Lion", "AdEMAMix4bit", "AdEMAMix8bit", "AdEMAMixFp8", "AdEMAMix"]


def _model(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 3), torch.nn.Flatten(), torch.nn.Linear(64 * 6 * 6, 300),
                            torch.nn.Linear(300, 10))
    return m.to(dtype=dtype, memory_format=torch.channels_last)


def _kwargs(name):
    if name.startswith("SGD"):
        return dict(momentum=0.9, nesterov=True, weight_decay=0.01)
    if name.startswith("AdEMAMix"):
        return dict(t_alpha=4, t_beta3=4)
    return {}


def _run(name, device, dtype, steps=4):
    model = _model(dtype).to(device)
    opt = getattr(lt, name)(model.parameters(), lr=1e-3, min_quant_size=256, **_kwargs(name))
    gen = torch.Generator().manual_seed(1)
    for k in range(steps):
        for p in model.parameters():
            p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(dtype).to(device)
            if p.dim() == 4:
                p.grad = p.grad.contiguous(memory_format=torch.channels_last)
        for g in opt.param_groups:
            g["lr"] = 1e-3 * (1 + 0.5 * (k % 3))
        opt.step()
    return model, opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CLASSES)
def test_cuda_equals_cpu(name, dtype):
    cpu_model, cpu_opt = _run(name, "cpu", dtype)
    gpu_model, gpu_opt = _run(name, "cuda", dtype)
    torch.cuda.synchronize()
    for a, b in zip(cpu_model.parameters(), gpu_model.parameters()):
        assert torch.equal(a, b.cpu())
    cs, gs = cpu_opt.state_dict()["state"], gpu_opt.state_dict()["state"]
    assert cs.keys() == gs.keys()
    for i in cs:
        for key, v in cs[i].items():
            w = gs[i][key]
            if torch.is_tensor(v):
                assert w.device.type == "cuda" or w.dim() == 0, key
                assert torch.equal(v, w.cpu()), (i, key)
            else:
                assert v == w


def test_cuda_state_dict_resumes_on_cpu():
    gpu_model, gpu_opt = _run("AdamW4bit", "cuda", torch.float32, steps=2)
    cpu_model = copy.deepcopy(gpu_model).cpu()
    cpu_opt = lt.AdamW4bit(cpu_model.parameters(), lr=1e-3, min_quant_size=256)
    cpu_opt.load_state_dict(gpu_opt.state_dict())
    for m, o in ((gpu_model, gpu_opt), (cpu_model, cpu_opt)):
        for p in m.parameters():
            p.grad = torch.full_like(p, 1e-3)
        o.step()
    for a, b in zip(cpu_model.parameters(), gpu_model.parameters()):
        assert torch.equal(a, b.cpu())


def test_cuda_grad_scaler_skips_overflow_and_steps_after():
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512).cuda()
    opt = lt.AdamW4bit(model.parameters(), lr=1e-3, min_quant_size=256)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 24)
    x = torch.randn(64, 512, device="cuda")
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x * 1e4).float().pow(2).mean()  # overflows in fp16 grads at this scale
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.cuda.synchronize()
    assert scaler.get_scale() < 2.0 ** 24
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)
    assert all(not opt.state[p] or int(opt.state[p]["step"]) == 0 for p in model.parameters())
    for _ in range(3):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _offload_twins():
    from lbopt.offload import CPUOffload

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    a, b = copy.deepcopy(base).cuda(), copy.deepcopy(base).cuda()
    return (a, lt.AdamW4bit(a.parameters(), lr=1e-2, min_quant_size=0)), \
        (b, CPUOffload(b.parameters(), lt.AdamW4bit, lr=1e-2, min_quant_size=0))


def test_offload_steps_equal_the_gpu_step_and_copy_grads_during_backward():
    """CPUOffload with real streams and pinned memory: the host step gives the GPU step's params bit for bit (the
    kernels are the same math), every grad is copied out during backward, and a forward right after step() reads
    the updated params (the caller's stream waits for their copy back)."""
    (a, oa), (b, ob) = _offload_twins()
    x = torch.randn(32, 64, device="cuda")
    for step in range(5):
        outs = []
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x * (step + 1)).pow(2).mean().backward()
            if o is ob:
                assert all(ob._offloaded[p].holds(p.grad) for p in b.parameters())
            o.step()
            outs.append(m(x))  # no synchronization between the step and this forward
        assert torch.equal(outs[0], outs[1])
    torch.cuda.synchronize()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert all(ob._offloaded[p].host.is_pinned() for p in b.parameters())


def test_fsdp2_cpu_offload_policy_steps_host_shards(tmp_path):
    """FSDP2's own CPUOffloadPolicy (sharded params and grads in host memory, the forward and backward on the GPU)
    with an lbopt.torch class, in one process (a world of 1, NCCL for CUDA tensors and gloo for host ones): the
    optimizer steps the host shards and tracks the same model trained on the GPU without FSDP."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        dist.init_process_group("cuda:nccl,cpu:gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    plain, sharded = copy.deepcopy(base).cuda(), copy.deepcopy(base)
    fully_shard(sharded, mesh=init_device_mesh("cuda", (1,)), offload_policy=CPUOffloadPolicy())
    opts = [lt.AdamW4bit(plain.parameters(), lr=1e-2, min_quant_size=0),
            lt.AdamW4bit(sharded.parameters(), lr=1e-2, min_quant_size=0)]
    x = torch.randn(32, 64, device="cuda")
    for step in range(5):
        for m, o in zip((plain, sharded), opts):
            o.zero_grad()
            m(x * (step + 1)).pow(2).mean().backward()
            o.step()
    assert all(p.to_local().device.type == "cpu" for p in sharded.parameters())
    assert all(t.device.type == "cpu" for st in opts[1].state.values() for t in st.values() if torch.is_tensor(t))
    for p, q in zip(plain.parameters(), sharded.parameters()):
        torch.testing.assert_close(q.full_tensor().cpu(), p.cpu(), rtol=1e-4, atol=1e-5)
