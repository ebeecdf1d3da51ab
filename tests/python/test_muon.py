"""lbopt.torch's Muon: the library's momentum step, which writes each param's update direction, under torch's
Newton-Schulz iteration and update, against torch.optim.Muon itself."""
import copy
import math

import pytest
import torch
from torch import nn

import lbopt.functional as F
import lbopt.torch as LT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KINDS = {"4bit": LT.Muon4bit, "8bit": LT.Muon8bit, "fp8": LT.MuonFp8, "fp32": LT.Muon}


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    # a wide matrix, a tall one (transposed in the iteration) and a square one, over min_quant_size
    return [torch.randn(shape, generator=g) * 0.1 for shape in ((48, 96), (160, 40), (72, 72))]


def _grads(params, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g) * 0.01 * (1 + step % 3) for p in params]


def _run(make, steps, **kwargs):
    params = [nn.Parameter(p.clone()) for p in _params()]
    opt = make(params, **kwargs)
    for step in range(steps):
        for p, g in zip(params, _grads(params, step)):
            p.grad = g
        for group in opt.param_groups:
            group["lr"] = 0.02 * (0.5 + 0.5 * math.cos(step / steps * math.pi))  # a new lr every step
        opt.step()
    return params, opt


@pytest.mark.parametrize("options", [{}, dict(nesterov=False), dict(momentum=0.3, weight_decay=0.0),
                                     dict(adjust_lr_fn="match_rms_adamw", ns_steps=3)], ids=str)
def test_fp32_states_equal_torch_muon_bit_for_bit(options):
    want, ref = _run(torch.optim.Muon, 100, **options)
    got, opt = _run(LT.Muon, 100, **options)
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    for w, g in zip(want, got):
        assert torch.equal(ref.state[w]["momentum_buffer"], opt.state[g]["momentum_buffer_codes"].view(w.shape))


def test_the_same_errors_as_torch_muon():
    p = nn.Parameter(torch.zeros(4, 4))
    for bad in (dict(lr=-1.0), dict(momentum=-0.1), dict(weight_decay=-1.0), dict(adjust_lr_fn="other")):
        with pytest.raises(ValueError) as want:
            torch.optim.Muon([p], **bad)
        with pytest.raises(ValueError) as got:
            LT.Muon4bit([p], **bad)
        assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
        LT.Muon4bit([nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match="bf16_stochastic_round=True is not supported"):
        LT.Muon4bit([p], bf16_stochastic_round=True)


@pytest.mark.parametrize("kind", ["4bit", "8bit", "fp8"])
def test_low_bit_momentum_is_the_fp32_one_within_its_codebook(kind):
    """After one step the momentum is (1 - momentum) g: the quantized state decodes to it within the kind's
    documented error (docs/formats.md; by default 4-bit and FP8 codes round stochastically, to either neighbour:
    a whole code step), and the params follow fp32's closely over a short run."""
    got, opt = _run(KINDS[kind], 1)
    block = F.state_layout(kind, 1)["block_size"]
    for p, g in zip(got, _grads(got, 0)):
        st = opt.state[p]
        m = torch.empty(p.numel())
        F.dequantize(kind, "m", {"codes": st["momentum_buffer_codes"], "scales": st["momentum_buffer_scales"]}, m)
        exact = torch.zeros(1).lerp(g.reshape(-1), 1 - 0.95)
        padded = torch.nn.functional.pad(exact.abs(), (0, -exact.numel() % block))
        absmax = padded.reshape(-1, block).amax(1).repeat_interleave(block)[:exact.numel()]
        bound = {"4bit": 0.225 * absmax, "8bit": 0.01 * absmax,
                 "fp8": exact.abs() / 8 + absmax / 448 * 2.0 ** -8}[kind]
        assert ((m - exact).abs() <= bound * 1.001).all()
    ten, _ = _run(KINDS[kind], 10)
    ref, _ = _run(LT.Muon, 10)
    for a, b, p0 in zip(ten, ref, _params()):
        assert (a - b).norm() < 0.25 * (b - p0).norm()


def test_a_state_dict_round_trip_continues_bit_identically(tmp_path):
    params, opt = _run(LT.Muon4bit, 5)
    sd = copy.deepcopy(opt.state_dict())
    torch.save(sd, tmp_path / "muon.pt")
    resumed_params = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = LT.Muon4bit(resumed_params)
    resumed.load_state_dict(torch.load(tmp_path / "muon.pt", weights_only=True))
    for step in range(5, 8):
        for group in (opt, resumed):
            for p, g in zip(group.param_groups[0]["params"], _grads(params, step)):
                p.grad = g
            group.step()
    for a, b in zip(params, resumed_params):
        assert torch.equal(a, b)


def test_a_torch_muon_state_dict_loads_into_lbopt():
    params, ref = _run(torch.optim.Muon, 3)
    mine = [nn.Parameter(p.detach().clone()) for p in params]
    opt = LT.Muon(mine)
    opt.load_state_dict(ref.state_dict())
    for p, q in zip(params, mine):
        assert torch.equal(ref.state[p]["momentum_buffer"].reshape(-1), opt.state[q]["momentum_buffer_codes"])


def test_muon_param_groups_and_a_paired_adamw_train_a_small_transformer_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 32), nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0,
                                                                             batch_first=True), nn.Linear(32, 50))
    muon, adamw = LT.muon_param_groups(model, adamw_names=("2.",))  # the head is module 2
    muon_ids, adamw_ids = {id(p) for p in muon}, {id(p) for p in adamw}
    assert all(p.ndim == 2 for p in muon) and {id(model[0].weight), id(model[2].weight)} <= adamw_ids
    assert muon_ids | adamw_ids == {id(p) for p in model.parameters()} and not muon_ids & adamw_ids
    opts = [LT.Muon4bit(muon, lr=0.02, min_quant_size=0), LT.AdamW4bit(adamw, lr=3e-3)]
    x = torch.randint(0, 50, (8, 16))
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_functional_step_writes_the_direction():
    g = torch.randn(300)
    direction = torch.full((300,), float("nan"))
    state = {"momentum_buffer": F.zeros_state("fp32", 300)}
    F.step("muon", [direction], [g], [state], 0.0, [1], kind="fp32", momentum=0.9, nesterov=True)
    buf = torch.as_tensor(state["momentum_buffer"]["codes"])
    assert torch.equal(buf, torch.zeros(300).lerp(g, 1 - 0.9))
    assert torch.equal(direction, g.lerp(buf, 0.9))


def test_a_refused_step_writes_nothing():
    """The calls of every group are validated before the first runs: a refusal in the second group leaves the
    first group's params and states as they were (none made)."""
    params = [nn.Parameter(p.clone()) for p in _params()]
    opt = LT.Muon4bit([{"params": params[:2]}, {"params": params[2:]}])
    for p, g in zip(params, _grads(params, 0)):
        p.grad = g
    opt.param_groups[1]["lr"] = float("nan")
    before = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before)) and not opt.state
