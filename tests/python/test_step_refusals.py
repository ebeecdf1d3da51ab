"""A step the library refuses for one param names that param (by its name where named parameters were given,
else by its shape) whichever call of the step holds it: the first, which the library validates as it runs, or a
later one, validated before the first runs. Nothing is written or counted."""
import pytest
import torch

import lbopt
import lbopt.torch as LT


def _params():
    a = torch.nn.Parameter(torch.zeros(8))
    b = torch.nn.Parameter(torch.zeros(3, 5, dtype=torch.float64))  # a dtype the library refuses
    c = torch.nn.Parameter(torch.zeros(8))
    for p in (a, b, c):
        p.grad = torch.ones_like(p)
    return a, b, c


@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("later_call", [False, True])
def test_a_refused_param_is_named(named, later_call):
    a, b, c = _params()
    entries = [("a", a), ("b", b), ("c", c)] if named else [a, b, c]
    groups = ([{"params": entries[:1]}, {"params": entries[1:]}] if later_call else [{"params": entries}])
    opt = LT.AdamW4bit(groups, min_quant_size=0)
    what = "param 'b'" if named else r"a param of shape \(3, 5\)"
    with pytest.raises(lbopt.LbOptTypeError, match=rf"^lbopt: {what}: slots\[\d\]\.param: dtype float64"):
        opt.step()
    assert not opt.state and not a.any() and not c.any()
