"""lbopt.torch from several Python threads at once, and in a process forked after lbopt's thread pool started
(a DataLoader's workers, multiprocessing's fork start method): the same results as one thread, and no hang."""
import os
import select
import signal
import threading

import pytest
import torch

import lbopt
import lbopt.torch as lbt


def _setup(seed):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (1 << 16, 4097, 300)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    return params, lbt.AdamW4bit(params, lr=1e-2, min_quant_size=0)


def _bits(params):
    return [p.detach().clone().view(torch.int32) for p in params]


@pytest.fixture
def two_threads():
    prev = lbopt.get_num_threads()
    lbopt.set_num_threads(2)
    yield
    lbopt.set_num_threads(prev)


def test_optimizers_stepped_from_two_threads_at_once_equal_sequential_steps(two_threads):
    ref = [_setup(seed) for seed in (1, 2)]
    for _ in range(20):
        for _, opt in ref:
            opt.step()
    runs = [_setup(seed) for seed in (1, 2)]
    start = threading.Barrier(2)

    def steps(opt):
        start.wait()
        for _ in range(20):
            opt.step()

    threads = [threading.Thread(target=steps, args=(opt,)) for _, opt in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (p_ref, _), (p_run, _) in zip(ref, runs):
        for a, b in zip(_bits(p_ref), _bits(p_run)):
            assert torch.equal(a, b)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_after_the_pool_started_steps_in_parent_and_child(two_threads):
    params, opt = _setup(3)
    opt.step()  # the pool's worker starts
    ref_params, ref_opt = _setup(3)
    ref_opt.step()
    ref_opt.step()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one step, then whether it equals the reference's second step
        try:
            # torch's own OpenMP pool does not survive a fork (its ops can hang in the child once the parent ran
            # them on several threads); DataLoader workers run torch with one thread likewise
            torch.set_num_threads(1)
            opt.step()
            same = all(torch.equal(a, b) for a, b in zip(_bits(params), _bits(ref_params)))
            os.write(write, b"same" if same else b"diff")
        finally:
            os._exit(0)
    os.close(write)
    answer = b"hung"
    try:
        if select.select([read], [], [], 60)[0]:
            answer = os.read(read, 4)
    finally:
        if answer == b"hung":
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
    assert answer == b"same"
    opt.step()  # the parent's pool still works
    assert all(torch.equal(a, b) for a, b in zip(_bits(params), _bits(ref_params)))
