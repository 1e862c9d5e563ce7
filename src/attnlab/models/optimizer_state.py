"""The trainer's tensors in a checkpoint: AdamW moments by parameter index and the torch RNG state.

    adamw.I.step, adamw.I.exp_avg, adamw.I.exp_avg_sq   for parameter I (optimizer order)
    rng.torch                                           torch.get_rng_state() (dropout masks)

Loading checks every tensor against the optimizer's parameters first, so a damaged or foreign
state is one AttnlabError naming the file and the tensor, never a failure at the first step.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.errors import AttnlabError, fmt_shape

_MOMENTS = ("exp_avg", "exp_avg_sq")


def trainer_tensors(optimizer: torch.optim.Optimizer) -> dict:
    """AdamW moments by parameter index, and the torch RNG state (dropout masks)."""
    tensors = {"rng.torch": torch.get_rng_state()}
    for idx, s in optimizer.state_dict()["state"].items():
        for k, v in s.items():
            tensors[f"adamw.{idx}.{k}"] = torch.as_tensor(v).detach().clone()
    return tensors


def load_trainer_tensors(optimizer: torch.optim.Optimizer, tensors: dict, path: Path) -> None:
    """Restore what `trainer_tensors` saved, after checking it fits `optimizer` (file `path`)."""
    sd = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = _adamw_state(tensors, params, path)
    rng = tensors.get("rng.torch")
    want = torch.get_rng_state()
    if rng is None or rng.dtype != want.dtype or rng.shape != want.shape:
        got = "missing" if rng is None else f"{rng.dtype} {fmt_shape(rng.shape)}"
        raise AttnlabError(f"checkpoint: {path}: 'rng.torch' must be the torch RNG state "
                           f"({want.dtype} {fmt_shape(want.shape)}), got {got}")
    try:
        torch.set_rng_state(rng)
    except RuntimeError as e:
        raise AttnlabError(f"checkpoint: {path}: 'rng.torch' is not a valid torch RNG state "
                           f"({str(e).strip().splitlines()[0]})") from None
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


def _adamw_state(tensors: dict, params: list, path: Path) -> dict[int, dict]:
    state: dict[int, dict] = {}
    for name, v in tensors.items():
        if name == "rng.torch":
            continue
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "adamw" or not parts[1].isdigit() \
                or int(parts[1]) >= len(params) or parts[2] not in ("step", *_MOMENTS):
            raise AttnlabError(f"checkpoint: {path}: unexpected tensor {name!r} (the optimizer "
                               f"has {len(params)} parameters)")
        idx, key = int(parts[1]), parts[2]
        want = params[idx].shape if key in _MOMENTS else torch.Size([])
        if v.shape != want or not v.is_floating_point():
            raise AttnlabError(f"checkpoint: {path}: {name!r} is {v.dtype} "
                               f"{fmt_shape(v.shape)}, parameter {idx} needs a float tensor of "
                               f"shape {fmt_shape(want)}")
        state.setdefault(idx, {})[key] = v
    # all parameters have moments after the first step, none before it
    if state and (len(state) != len(params) or any(len(s) != 3 for s in state.values())):
        incomplete = next((i for i in range(len(params)) if len(state.get(i, {})) != 3), None)
        raise AttnlabError(f"checkpoint: {path}: the AdamW state of parameter {incomplete} is "
                           "incomplete (expected step, exp_avg and exp_avg_sq for every "
                           "parameter)")
    return state
