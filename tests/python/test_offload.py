"""lbopt.offload.CPUOffload on a machine without a GPU: params on the CPU, so its transfers are plain copies, which
still checks all of its bookkeeping. Every test steps the same model twice, once through CPUOffload and once with
the same optimizer on the params themselves, and requires the same params bit for bit: over many steps, with
several groups and state kinds, a changing lr, gradient accumulation, clipping, GradScaler and its skipped steps,
and checkpoints moved either way."""
import copy
import time

import pytest
import torch
from torch import nn

import lbopt.torch as LT
from lbopt.offload import CPUOffload


def model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 300), nn.ReLU(), nn.Linear(300, 8)).to(dtype)


def groups(m):
    """Two groups: the first layer at a lower lr in 4-bit, the rest at the optimizer's lr."""
    return [{"params": list(m[0].parameters()), "lr": 3e-3}, {"params": list(m[2].parameters())}]


def twins(make_opt, dtype=torch.float32):
    a, b = model(dtype=dtype), model(dtype=dtype)
    return (a, make_opt(a, plain=True)), (b, make_opt(b, plain=False))


def make(cls=LT.AdamW4bit, **kwargs):
    def build(m, plain):
        return cls(groups(m), **kwargs) if plain else CPUOffload(groups(m), cls, **kwargs)
    return build


def backward(m, seed, scaler=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 32, generator=g, dtype=next(m.parameters()).dtype)
    loss = m(x).float().pow(2).mean()
    (scaler.scale(loss) if scaler else loss).backward()


def assert_same(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("cls", [LT.AdamW4bit, LT.AdamW8bit, LT.SGD4bit, LT.Lion4bit, LT.AdEMAMix4bit, LT.AdamW])
def test_steps_equal_the_same_optimizer_on_the_params(cls):
    (a, oa), (b, ob) = twins(make(cls, lr=1e-2, min_quant_size=0))
    sched = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20) for o in (oa, ob)]
    for step in range(12):
        for (m, o), s in zip(((a, oa), (b, ob)), sched):
            o.zero_grad()
            backward(m, step)
            o.step()
            s.step()
        assert_same(a, b)
    assert ob.param_groups[0]["lr"] == oa.param_groups[0]["lr"] != 3e-3


def test_every_grad_is_copied_during_backward():
    _, (b, ob) = twins(make())
    backward(b, 0)
    assert all(ob._offloaded[p].holds(p.grad) for p in b.parameters())


def test_gradient_accumulation_and_clipping():
    """Two backward passes per step, then clip_grad_norm_ on the device grads: the grads changed after their copy
    during backward are copied again by step()."""
    (a, oa), (b, ob) = twins(make(lr=1e-2, min_quant_size=0))
    for step in range(6):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad(set_to_none=step % 2 == 0)
            backward(m, 2 * step)
            backward(m, 2 * step + 1)
            nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            if o is ob:  # clipped after their copies
                assert not any(ob._offloaded[p].holds(p.grad) for p in b.parameters())
            o.step()
        assert_same(a, b)


def test_grad_scaler_and_its_skipped_steps():
    (a, oa), (b, ob) = twins(make(lr=1e-2, min_quant_size=0))
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) for _ in range(2)]
    for step in range(6):
        for (m, o), scaler in zip(((a, oa), (b, ob)), scalers):
            o.zero_grad()
            backward(m, step, scaler)
            if step == 3:
                next(m.parameters()).grad[0, 0] = float("inf")  # this step is skipped
            if step == 4:
                scaler.unscale_(o)  # then clip, as torch's AMP recipe does
                nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            scaler.step(o)
            scaler.update()
        assert_same(a, b)
    assert oa.state[next(a.parameters())]["step"] == 5
    assert scalers[0].get_scale() == scalers[1].get_scale()


def test_bf16_params_with_an_fp32_master():
    """A bf16 param with an fp32 master steps as an fp32 param with the bf16 grad would, and receives the master
    rounded to bf16."""
    ref = model()
    oref = LT.AdamW4bit(groups(ref), lr=1e-2, min_quant_size=0)
    b = model(dtype=torch.bfloat16)
    for p, q in zip(ref.parameters(), b.parameters()):
        p.data.copy_(q.float())
    ob = CPUOffload(groups(b), LT.AdamW4bit, fp32_master=True, lr=1e-2, min_quant_size=0)
    for step in range(5):
        ob.zero_grad()
        backward(b, step)
        for p, q in zip(ref.parameters(), b.parameters()):
            p.grad = q.grad.float()
        oref.step()
        ob.step()
        for p, q in zip(ref.parameters(), b.parameters()):
            assert torch.equal(p.bfloat16(), q)
            assert torch.equal(ob._offloaded[q].host, p)


@pytest.mark.parametrize("direction", ["offload to plain", "plain to offload"])
def test_checkpoints_move_either_way(direction):
    (a, oa), (b, ob) = twins(make(lr=1e-2, min_quant_size=0))
    src, dst = (ob, oa) if direction == "offload to plain" else (oa, ob)
    for step in range(3):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, step)
            o.step()
    dst.load_state_dict(copy.deepcopy(src.state_dict()))
    for step in range(3, 6):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, step)
            o.step()
        assert_same(a, b)


def test_a_group_added_later_is_offloaded():
    (a, oa), (b, ob) = twins(make(lr=1e-2, min_quant_size=0))
    first = torch.randn(500)
    extra = [nn.Parameter(first.clone()) for _ in range(2)]
    for o, p in zip((oa, ob), extra):
        o.add_param_group({"params": [p], "lr": 5e-2})
    for step in range(3):
        for (m, o), p in zip(((a, oa), (b, ob)), extra):
            o.zero_grad()
            backward(m, step)
            p.grad = torch.full((500,), 0.5)
            o.step()
        assert_same(a, b)
        assert torch.equal(extra[0], extra[1])


def test_host_steps_during_backward():
    """step_in_backward=True: each param's host step begins as soon as its grad is out, before backward returns
    (a step of the wrapped optimizer seen from inside backward), with the results of the same optimizer."""
    (a, oa), (b, ob) = twins(lambda m, plain: LT.AdamW4bit(groups(m), lr=1e-2, min_quant_size=0) if plain else
                             CPUOffload(groups(m), LT.AdamW4bit, step_in_backward=True, lr=1e-2, min_quant_size=0))
    seen = []
    # backward through the first layer waits a little, so that the steps of the last layer's params can begin
    b[0].register_full_backward_pre_hook(lambda module, grad_out: time.sleep(0.05))
    host_step = ob.optimizer.step
    ob.optimizer.step = lambda: (seen.append(time.perf_counter()), host_step())[1]
    for step in range(4):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, step)
            if o is ob:
                backward_done = time.perf_counter()
                assert len(ob._early) == 4
                for future in ob._early.values():
                    future.result()
                assert min(seen) < backward_done
                seen.clear()
            o.step()
        assert_same(a, b)


def test_a_grad_changed_after_its_host_step_raises():
    _, (b, ob) = twins(lambda m, plain: CPUOffload(groups(m), LT.AdamW4bit, step_in_backward=True, lr=1e-2))
    backward(b, 0)
    nn.utils.clip_grad_norm_(b.parameters(), 1e-3)
    with pytest.raises(RuntimeError, match="changed after their host step"):
        ob.step()
    for p in b.parameters():  # the params went back as the host stepped them
        assert torch.equal(p, ob._offloaded[p].host)


def test_an_optimizer_dropped_copies_nothing_more():
    m = model()
    opt = CPUOffload(m.parameters(), LT.AdamW4bit)
    first = next(m.parameters())
    assert len(first._post_accumulate_grad_hooks) == 1
    del opt
    assert not first._post_accumulate_grad_hooks
    backward(m, 0)  # no hook of the dropped optimizer runs


def test_torchtitan_flattened_state_dict_through_dcp(tmp_path):
    """get_state_dict with flatten_optimizer_state_dict=True, dcp.save, then a fresh model and CPUOffload whose own
    flattened state dict is the template for dcp.load and set_state_dict (which read opt.state by device param):
    the next step is the saved optimizer's."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    (_, _), (b, ob) = twins(make(lr=1e-2, min_quant_size=0))
    for step in range(2):
        ob.zero_grad()
        backward(b, step)
        ob.step()
    model_sd, optim_sd = get_state_dict(b, ob, options=flat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to save in a single process"
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp_path))
        c = model(seed=1)
        oc = CPUOffload(groups(c), LT.AdamW4bit, lr=1e-2, min_quant_size=0)
        model_sd, optim_sd = get_state_dict(c, oc, options=flat)
        sd = {"model": model_sd, "optim": optim_sd}
        dcp.load(sd, checkpoint_id=str(tmp_path))
    set_state_dict(c, oc, model_state_dict=sd["model"], optim_state_dict=sd["optim"], options=flat)
    assert {oc.state[p]["step"] for p in c.parameters()} == {2}
    for m, o in ((b, ob), (c, oc)):
        o.zero_grad()
        backward(m, 9)
        o.step()
    assert_same(b, c)


@pytest.mark.parametrize("step_in_backward", [False, True])
def test_params_written_on_the_device_are_stepped_from_their_new_values(step_in_backward):
    """A model checkpoint loaded (or any write to a param) after the optimizer was made or stepped: the host copy
    takes the param's new value before the next step."""
    a = model()
    oa = LT.AdamW4bit(groups(a), lr=1e-2, min_quant_size=0)
    b = model(seed=3)
    ob = CPUOffload(groups(b), LT.AdamW4bit, step_in_backward=step_in_backward, lr=1e-2, min_quant_size=0)
    b.load_state_dict(a.state_dict())
    for step in range(3):
        if step == 2:
            with torch.no_grad():
                a[0].weight.mul_(0.5)
                b[0].weight.mul_(0.5)
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            backward(m, step)
            o.step()
        assert_same(a, b)
