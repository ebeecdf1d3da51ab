"""lbopt.torch reuses a param group's plan from one step to the next (only the grads' data pointers and the step
counts are written) while nothing it was built from changes. Each test changes one such thing between steps and
checks the next step against an optimizer built after the change, which has never planned anything: equal params
and equal states, in the state dicts the optimizer holds now."""
import copy

import pytest
import torch
from torch import nn

import lbopt.torch as LT


def make(amsgrad=False):
    torch.manual_seed(0)
    # a 4-bit call and an fp32 call (the small param), and a param with no grad
    params = [nn.Parameter(torch.randn(30, 30)), nn.Parameter(torch.randn(500)), nn.Parameter(torch.randn(3, 3)),
              nn.Parameter(torch.randn(300))]
    opt = LT.LowBitAdamW(params, lr=1e-2, amsgrad=amsgrad, min_quant_size=100)
    return opt, params


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params[:3]:
        p.grad = torch.randn(p.shape, generator=g)


def twin_of(opt):
    """A new optimizer over clones of opt's params and grads, loaded with opt's state."""
    params = opt.param_groups[0]["params"]
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, twins):
        q.grad = None if p.grad is None else p.grad.clone()
    other = LT.LowBitAdamW(twins, min_quant_size=100)
    saved = copy.deepcopy(opt.state_dict())
    amsgrad = saved["param_groups"][0]["amsgrad"]
    if not any("max_exp_avg_sq_codes" in st for st in saved["state"].values()):
        saved["param_groups"][0]["amsgrad"] = False  # turned on since the last step: no max state yet
    other.load_state_dict(saved)
    other.param_groups[0]["amsgrad"] = amsgrad
    return other


def assert_same_step(opt):
    other = twin_of(opt)
    opt.step()
    other.step()
    mine, theirs = opt.state_dict(), other.state_dict()
    for p, q in zip(opt.param_groups[0]["params"], other.param_groups[0]["params"]):
        assert torch.equal(p.detach(), q.detach())
    assert mine["state"].keys() == theirs["state"].keys()
    for i, st in mine["state"].items():
        assert st.keys() == theirs["state"][i].keys()
        for k, v in st.items():
            assert torch.equal(v, theirs["state"][i][k]) if torch.is_tensor(v) else v == theirs["state"][i][k], k


def replace_state_tensor(opt, params):
    st = opt.state[params[0]]
    st["exp_avg_codes"] = st["exp_avg_codes"].clone()


def replace_state_dict(opt, params):
    opt.state[params[1]] = copy.deepcopy(opt.state[params[1]])


def drop_state(opt, params):
    del opt.state[params[1]]


def drop_grad(opt, params):
    params[1].grad = None


def add_grad(opt, params):
    params[3].grad = torch.randn(300)


def transpose_grad(opt, params):
    params[0].grad = params[0].grad.t().contiguous().t()  # the same values in column-major order


def transpose_param(opt, params):
    # the same data pointer and shape, the grad as it was; fp32 states, which a new memory order keeps exactly
    params[2].data = params[2].data.t()


def move_param(opt, params):
    params[1].data = params[1].data.clone()


def append_param(opt, params):
    q = nn.Parameter(torch.randn(200))
    q.grad = torch.randn(200)
    opt.param_groups[0]["params"].append(q)


def swap_param(opt, params):
    q = nn.Parameter(torch.randn(500))
    q.grad = torch.randn(500)
    opt.param_groups[0]["params"][1] = q
    del opt.state[params[1]]


def turn_on_amsgrad(opt, params):
    opt.param_groups[0]["amsgrad"] = True


CHANGES = [replace_state_tensor, replace_state_dict, drop_state, drop_grad, add_grad, transpose_grad,
           transpose_param, move_param, append_param, swap_param, turn_on_amsgrad]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__ for c in CHANGES])
def test_a_change_between_steps_steps_like_a_fresh_optimizer(change):
    opt, params = make()
    for seed in range(3):
        set_grads(params, seed)
        opt.step()
    change(opt, params)
    assert_same_step(opt)
    set_grads(params, 7)
    assert_same_step(opt)  # and the step after, planned from the changed state


def test_a_steady_step_reuses_its_plan():
    opt, params = make(amsgrad=True)
    set_grads(params, 0)
    opt.step()
    plan = opt._plans[id(opt.param_groups[0])]
    for seed in range(1, 4):
        set_grads(params, seed)
        assert_same_step(opt)
        assert opt._plans[id(opt.param_groups[0])] is plan


def test_a_param_put_in_place_of_another_is_stepped():
    opt, params = make()
    for seed in range(2):
        set_grads(params, seed)
        opt.step()
    q = nn.Parameter(torch.zeros(500))
    q.grad = torch.ones(500)
    opt.param_groups[0]["params"][1] = q  # the old param keeps its state and its grad
    before = params[1].detach().clone()
    opt.step()
    assert opt.state[q]["step"] == 1 and (q < 0).all()
    assert torch.equal(params[1].detach(), before)


def test_a_refused_step_leaves_no_plan_behind():
    """A step refused after planning (a grad of the wrong size) writes nothing; the next step, with a good grad,
    is planned again and steps like a fresh optimizer."""
    opt, params = make()
    set_grads(params, 0)
    opt.step()
    params[1].grad.data = torch.randn(499)  # what autograd would refuse, set past its checks
    with pytest.raises(ValueError):
        opt.step()
    params[1].grad.data = torch.randn(500)
    assert_same_step(opt)
