"""One optimizer step's two halves on a plain model: accumulated gradients are those of the mean
loss over the whole batch; applying them clips, steps, advances the LR and clears them."""

import pytest
import torch
import torch.nn.functional as F

from trainer.models.llama import Transformer
from trainer.presets import PRESETS
from trainer.step import apply_gradients, forward_backward, read_losses

ARGS = PRESETS["tiny"].with_vocab(97)


def model_and_batch():
    torch.manual_seed(0)
    model = Transformer(ARGS)
    windows = torch.randint(0, 97, (4, 9), generator=torch.Generator().manual_seed(1))
    return model, windows


@pytest.mark.slow
def test_accumulated_micro_batches_give_the_whole_batch_gradient_and_mean_loss():
    model, windows = model_and_batch()
    whole = F.cross_entropy(model(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten())
    whole.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    micro_batches = ((windows[i : i + 2, :-1], windows[i : i + 2, 1:]) for i in (0, 2))
    loss = forward_backward(model, micro_batches, accum_steps=2)
    assert loss.shape == () and loss.item() == pytest.approx(whole.item(), abs=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7)


def test_applying_clips_steps_advances_the_schedule_and_clears_the_gradients():
    model, windows = model_and_batch()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    forward_backward(model, iter([(windows[:, :-1], windows[:, 1:])]), accum_steps=1)
    apply_gradients(model, optimizer, scheduler, None, grad_clip=0.01)

    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert moved.norm().item() == pytest.approx(0.01, rel=1e-4)  # lr 1 x gradient clipped to norm 0.01
    assert all(p.grad is None for p in model.parameters())
    assert (scheduler.last_epoch, scheduler.get_last_lr()[0]) == (1, 0.5)


def test_a_step_without_micro_batches_is_refused():
    model, _ = model_and_batch()
    with pytest.raises(
        ValueError, match="a step needs at least one micro-batch; got none for 2 accumulation steps"
    ):
        forward_backward(model, iter([]), accum_steps=2)


def test_losses_stay_tensors_until_read_together_as_means_over_the_ranks():
    model, windows = model_and_batch()
    losses = [forward_backward(model, iter([(windows[:, :-1], windows[:, 1:])]), accum_steps=1)]
    assert isinstance(losses[0], torch.Tensor) and losses[0].shape == ()  # nothing read yet
    losses.append(torch.tensor(2.5))
    sums = []

    def two_ranks(tensor: torch.Tensor) -> torch.Tensor:  # as if a second rank had the same losses + 1
        sums.append(tensor.clone())
        return tensor.mul_(2).add_(1)

    means = read_losses(losses, two_ranks, world_size=2)
    assert len(sums) == 1 and sums[0].dtype == torch.float64  # one collective for every step, in float64
    assert means == pytest.approx([losses[0].item() + 0.5, 3.0])
    assert read_losses([], two_ranks, world_size=2) == [] and len(sums) == 1
