"""What a checkpoint holds: the train state (step, cursor, RNG) and the model and optimizer as
``Stateful`` objects, round-tripped through their state dicts."""

import copy

import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful

from trainer.optim import build_optimizer, build_scheduler
from trainer.presets import PRESETS
from trainer.state import ModelState, OptimizerState, TrainState, checkpoint_states


def test_train_state_saves_step_cursor_and_the_rng_as_of_now():
    state = TrainState(torch.device("cpu"), step=12, cursor=192)
    torch.manual_seed(4)
    saved = state.state_dict()
    expected = torch.rand(5)  # what the run would have drawn next
    assert (saved["step"], saved["cursor"], saved["rng"]["cuda"]) == (12, 192, None)

    fresh = TrainState(torch.device("cpu"))
    torch.manual_seed(1234)
    fresh.load_state_dict(saved)
    assert (fresh.step, fresh.cursor) == (12, 192)
    assert torch.equal(torch.rand(5), expected)
    assert isinstance(fresh, Stateful)


def tiny_model(seed: int):
    from trainer.models.llama import Transformer

    torch.manual_seed(seed)
    return Transformer(PRESETS["tiny"].with_vocab(97))


def one_step(model, optimizer) -> None:
    tokens = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.slow
def test_model_and_optimizer_states_are_keyed_by_parameter_name_and_load_back():
    model = tiny_model(0)
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    one_step(model, optimizer)
    model_sd, optim_sd = ModelState(model).state_dict(), OptimizerState(model, optimizer).state_dict()
    assert set(model_sd) == {name for name, _ in model.named_parameters()}
    assert set(optim_sd["state"]) == set(model_sd)  # by name, not position: it reshards with the model

    saved = copy.deepcopy((model_sd, optim_sd))  # as a checkpoint holds them: apart from the live tensors
    other = tiny_model(1)
    other_optimizer = build_optimizer(other, lr=1e-2, weight_decay=0.1)
    ModelState(other).load_state_dict(saved[0])
    OptimizerState(other, other_optimizer).load_state_dict(saved[1])
    for m, opt in ((model, optimizer), (other, other_optimizer)):
        one_step(m, opt)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name


def test_checkpoint_states_name_what_a_training_checkpoint_owns():
    from trainer.parallel import grad_scaler

    model = tiny_model(0)
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    scheduler = build_scheduler(optimizer, warmup_steps=1, max_steps=4, min_lr_ratio=0.1)
    train_state = TrainState(torch.device("cpu"))
    states = checkpoint_states(model, optimizer, scheduler, None, train_state)
    assert list(states) == ["model", "optim", "scheduler", "train_state"]
    assert states["train_state"] is train_state and states["scheduler"] is scheduler
    assert all(isinstance(state, Stateful) for state in states.values())
    with_scaler = checkpoint_states(model, optimizer, scheduler, grad_scaler("fp16"), train_state)
    assert list(with_scaler) == ["model", "optim", "scheduler", "train_state", "scaler"]
