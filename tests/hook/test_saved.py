"""The saved-tensor counter: storages saved for backward, parameters skipped, each storage once; what
is still held during backward."""

from __future__ import annotations

import torch

from anatomy.hook.saved import SavedTensorCounter


def test_saved_tensor_counter_skips_parameters_and_counts_storages_once() -> None:
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)
    counter = SavedTensorCounter(lin.parameters())
    with counter:
        h = lin(x)
        y = torch.tanh(h)  # saves its output
        z = (y * y).sum()  # saves y twice: one storage
    # linear saves x (weight is a parameter: skipped); tanh saves y; mul saves y (same storage).
    assert counter.activation_bytes == x.numel() * 4 + y.numel() * 4
    assert counter.weight_copy_bytes == 0
    assert not counter.active
    z.backward()


def test_alive_saved_tensors_are_followed_through_backward() -> None:
    """On a traced step the counter knows what is still held at any moment: everything saved after the
    forward, less as backward frees each node's saved tensors, nothing after it."""
    lin1, lin2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 8)
    params = [*lin1.parameters(), *lin2.parameters()]
    x = torch.randn(32, 64)
    counter = SavedTensorCounter(params)
    counter.track_alive = True
    seen_in_backward: list[int] = []
    with counter:
        h = lin1(x)
        a = torch.relu(h)  # saves its output a
        y = lin2(a)  # saves a again (same storage): counted once
        loss = (y * y).sum()  # saves y
    assert (
        counter.alive_activation_bytes
        == counter.activation_bytes
        == a.numel() * 4 + y.numel() * 4 + x.numel() * 4
    )
    a.register_hook(lambda g: seen_in_backward.append(counter.alive_activation_bytes))
    del h, a, y
    loss.backward()
    # when a's gradient arrived, mul's saved y was freed; relu's saved a (its output) not yet
    assert seen_in_backward == [x.numel() * 4 + 32 * 128 * 4]
    assert counter.alive_activation_bytes == x.numel() * 4  # x is still held here, by the test
    del x
    assert counter.alive_activation_bytes == 0
    counter.track_alive = False


def test_watching_what_is_alive_keeps_one_tracked_object_per_saved_tensor() -> None:
    """A traced step of a deep model saves thousands of tensors: each watched with one weak reference and
    nothing else the garbage collector tracks (a bound callback and a list per storage made three, and
    gen-2 collections on a 96-layer model that the plain loop never has)."""
    import gc

    blocks = [torch.nn.Linear(16, 16) for _ in range(40)]
    params = [p for b in blocks for p in b.parameters()]
    x = torch.randn(4, 16)

    def forward() -> torch.Tensor:
        h = x
        for b in blocks:
            h = torch.tanh(b(h))  # (linear saves its input, tanh its output: a new storage each)
        return h.sum()

    def tracked_growth(counter: SavedTensorCounter) -> tuple[int, torch.Tensor]:
        gc.collect()
        gc.disable()
        try:
            before = len(gc.get_objects())
            with counter:
                out = forward()
            return len(gc.get_objects()) - before, out
        finally:
            gc.enable()

    counting, kept = tracked_growth(SavedTensorCounter(params))  # (what autograd keeps of a pack's result)
    del kept
    counter = SavedTensorCounter(params)
    counter.track_alive = True
    watched, out = tracked_growth(counter)
    saved = len(counter._refs)
    assert saved >= 80  # (40 inputs of linear layers, 40 outputs of tanh)
    assert watched - counting <= saved + 8, (watched, counting, saved)  # (the counter's own few on top)
    out.backward()
    del out
    # (x, the first layer's input, is still held here by the test: its saved tensor with it)
    assert counter.alive_activation_bytes == x.numel() * 4
    assert len(counter._refs) == len(counter._ref_keys) == 1
    counter.track_alive = False
