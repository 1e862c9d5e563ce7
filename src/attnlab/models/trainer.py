"""Trainer: AdamW with linear warm-up and cosine decay, gradient clipping, periodic validation,
a progress bar (loss, tokens/s), and atomic, resumable checkpoints.

Resuming restores the weights, the AdamW moments, the torch RNG state (dropout) and the step;
batches depend only on (seed, step) (see `batches`), so an interrupted-and-resumed run produces
the same loss curve as an uninterrupted one.

A run that diverges stops: a NaN/Inf training or validation loss, or a NaN/Inf gradient norm,
raises AttnlabError before the optimizer step and before any save, so the last good checkpoint
stays. An output directory that cannot be written is refused when the Trainer is made.

Across processes (`parallel`, see `attnlab.models.parallel`): every rank trains on its rows of the
same global batch, losses are summed over all ranks (so every rank sees the same loss and the
same gradient norm, and a diverging run stops on every rank at the same step), rank 0 alone
writes checkpoints and shows progress, and no rank goes on before the save has committed. A stop
request (`request_stop`, Ctrl-C) travels with the step's loss: every rank learns of it in the same
step, so all stop after that step and the checkpoint they save is one they agree on.
Checkpoints are the one-process format: they load in one process and resume under any (D, C).

One writer per run directory: `run` and `save` hold the directory's lock (see
`attnlab.models.run_lock`; rank 0 alone across processes, or the launcher of `attnlab train
--nproc` for its workers), and a second trainer on the directory is refused, naming the holder.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from attnlab.errors import AttnlabError
from attnlab.models.batches import TokenData, batch
from attnlab.models.checkpoint import (
    META_FILE,
    check_writable,
    model_from_checkpoint,
    read_checkpoint,
    save_checkpoint,
    tokenizer_from_checkpoint,
)
from attnlab.models.checkpoint_checks import checked_config
from attnlab.models.config import GPTConfig, TrainConfig
from attnlab.models.corpus import load_corpus
from attnlab.models.gpt import GPT
from attnlab.models.optimizer_state import load_trainer_tensors, trainer_tensors
from attnlab.models.repeats import repeat_windows
from attnlab.models.run_lock import RunLock
from attnlab.models.schedule import lr_at, make_optimizer, with_schedule
from attnlab.models.tokenizer import CharTokenizer

if TYPE_CHECKING:
    from attnlab.models.parallel import Parallel


#: tokens in one global batch (batch_size x block_size): 128 MiB of int64 inputs and targets
MAX_BATCH_TOKENS = 1 << 23


class Trainer:
    """Trains a GPT on a token stream; `run()` to train, `save()` to checkpoint."""

    def __init__(self, model: GPT, tokenizer, data: TokenData, config: TrainConfig, *,
                 out=None, progress: bool = False, parallel: Parallel | None = None):
        self.model, self.tokenizer, self.data, self.config = model, tokenizer, data, config
        tokens = config.batch_size * model.config.block_size
        if tokens > MAX_BATCH_TOKENS:  # before any batch is allocated
            raise AttnlabError(f"batch_size: {config.batch_size} rows of block_size "
                               f"{model.config.block_size} are {tokens:,} tokens a step; the "
                               f"limit is {MAX_BATCH_TOKENS:,}")
        self.parallel = parallel
        main = parallel is None or parallel.is_main
        self.out = None if out is None else (check_writable(out, "out") if main else Path(out))
        self.progress = progress and main
        self.forward = model  # the module the training step calls (DDP across processes)
        if parallel is not None:
            self._distribute(parallel)
        self.optimizer = make_optimizer(model, config)
        self.step = 0
        self.history: list[dict] = []  # per step: {"step", "loss", "lr"}
        self.val_history: list[dict] = []  # per validation: {"step", "val_loss"}
        self.tokens_seen, self.elapsed_s = 0, 0.0
        #: called with the trainer after each evaluation's checkpoint (`attnlab train` prints a
        #: sample there); the main process only
        self.on_eval: list = []
        self._stop_requested = False  # this process was asked to stop (Ctrl-C)
        self._stop_agreed = False  # every rank knows: stop after this step
        self._saved_step: int | None = None  # step of the checkpoint in `out`, once there is one
        # one writer per directory: taken by `run` and `save`, refused while another holds it
        self._lock = RunLock(self.out) if self.out is not None and main else None

    def _distribute(self, par: Parallel) -> None:
        err = None
        if self.config.batch_size % par.dp:
            err = AttnlabError(f"batch_size: the global batch of {self.config.batch_size} rows "
                               f"does not split over --dp {par.dp} replicas")
        if err is not None:
            err.every_rank = True  # every rank finds the same: rank 0 says it
            raise err
        self.model.to(par.device).set_context_parallel(par.handle)
        self.forward = par.wrap(self.model)

    @classmethod
    def start(cls, preset: str = "tiny", *, out=None, progress: bool = False,
              parallel: Parallel | None = None, model_overrides: dict | None = None,
              **train_overrides) -> Trainer:
        """A fresh run of a named preset on its bundled corpus."""
        tcfg = TrainConfig.from_name(preset, **train_overrides)
        text = load_corpus(tcfg.corpus)
        tok = CharTokenizer.from_text(text)
        mcfg = GPTConfig.from_name(preset, vocab_size=tok.vocab_size, **(model_overrides or {}))
        data = TokenData.split(tok.encode(text), tcfg.val_fraction, mcfg.block_size)
        torch.manual_seed(tcfg.seed)  # the initial weights, and dropout after that
        return cls(GPT(mcfg), tok, data, tcfg, out=out, progress=progress, parallel=parallel)

    @classmethod
    def resume(cls, out, *, progress: bool = False, max_steps: int | None = None,
               parallel: Parallel | None = None, lr: float | None = None,
               min_lr: float | None = None, warmup_steps: int | None = None,
               dropout: float | None = None) -> Trainer:
        """Continue the run checkpointed in `out`; `max_steps` moves its end and the schedule's;
        `lr`, `min_lr`, `warmup_steps` change the schedule from here on (see `with_schedule`),
        `dropout` the model's dropout; the next checkpoint records them."""
        ck = read_checkpoint(out, with_trainer=True)
        meta = ck.path / META_FILE
        if ck.doc.get("train") is None:
            raise AttnlabError(f"resume: {out} holds a model without training state")
        tcfg = checked_config(meta, "train", TrainConfig.from_dict, ck.doc["train"])
        if max_steps is not None:
            tcfg = TrainConfig.from_dict({**tcfg.to_dict(), "max_steps": max_steps})
        tcfg = with_schedule(tcfg, lr=lr, min_lr=min_lr, warmup_steps=warmup_steps)
        model = model_from_checkpoint(ck, dropout=dropout)
        tok = tokenizer_from_checkpoint(ck, model.config.vocab_size)
        state = _resume_state(meta, ck.doc["state"])
        data = TokenData.split(tok.encode(load_corpus(tcfg.corpus)), tcfg.val_fraction,
                               model.config.block_size)
        self = cls(model, tok, data, tcfg, out=out, progress=progress, parallel=parallel)
        load_trainer_tensors(self.optimizer, ck.trainer_tensors, ck.file("trainer"))
        self.step, self.history, self.val_history = state["step"], state["history"], state["val"]
        self.tokens_seen, self.elapsed_s = state["tokens_seen"], state["elapsed_s"]
        self._saved_step = self.step
        return self

    # -- one step, one validation ------------------------------------------------------------

    def train_step(self) -> float:
        cfg, model = self.config, self.model
        model.train()
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        xy = batch(self.data.train, cfg.batch_size, model.config.block_size, cfg.seed, self.step)
        if cfg.repeat_prob > 0:
            xy = repeat_windows(*xy, prob=cfg.repeat_prob, seed=cfg.seed, index=self.step)
        x, y = self._rows(xy)
        if self.parallel is not None:  # context-parallel attention dropout keyed by the step
            self.parallel.key_dropout(model, cfg.seed, self.step)
        _, loss = self.forward(x, y)
        value = self._global_loss(loss, with_stop=True)
        if not math.isfinite(value):
            raise self._diverged(f"the training loss is {value}", self.step + 1, lr)
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages over all D·C ranks; a share summed over C ranks is a replica's mean
        (loss if self.parallel is None else loss * self.parallel.cp).backward()
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise self._diverged(f"the gradient norm is {norm.item()}", self.step + 1, lr)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, cfg.grad_clip, norm)
        self.optimizer.step()
        self.step += 1
        self.tokens_seen += cfg.batch_size * model.config.block_size  # every rank's rows
        self.history.append({"step": self.step, "loss": value, "lr": lr})
        return value

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over a fixed set of validation batches (the same ones every time)."""
        cfg, model = self.config, self.model
        model.eval()
        losses = [self._global_loss(model(*self._rows(batch(
            self.data.val, cfg.batch_size, model.config.block_size, cfg.seed + 1, i)))[1])
            for i in range(cfg.eval_batches)]
        return sum(losses) / len(losses)

    def _rows(self, xy):
        """This rank's rows of a global batch, on its device."""
        if self.parallel is None:
            return xy
        rows = self.parallel.rows(self.config.batch_size)
        return tuple(t[rows].to(self.parallel.device) for t in xy)

    def _global_loss(self, loss: torch.Tensor, with_stop: bool = False) -> float:
        """The global batch's mean loss: this process's, or the sum of every rank's share over
        the D replicas (the same number on every rank). `with_stop`: the same all-reduce tells
        every rank whether any was asked to stop."""
        if self.parallel is None:
            return loss.item()
        if not with_stop:
            return self.parallel.sum(loss.item()) / self.parallel.dp
        total, stops = self.parallel.sums([loss.item(), float(self._stop_requested)])
        self._stop_agreed = self._stop_agreed or stops > 0
        return total / self.parallel.dp

    def request_stop(self) -> None:
        """Stop after the step in progress (every rank: after the same step), save, and raise
        KeyboardInterrupt from `run`. Safe to call from a signal handler."""
        self._stop_requested = True

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop_after: int | None = None, *, handle_interrupt: bool = False) -> list[dict]:
        """Train to config.max_steps (or `stop_after` steps from now), validating and saving every
        eval_interval steps and at the end. With handle_interrupt, Ctrl-C finishes the current
        step, saves, and then raises KeyboardInterrupt (as `request_stop` does; across processes
        every rank stops after the same step and rank 0 saves)."""
        cfg = self.config
        end = cfg.max_steps if stop_after is None else min(cfg.max_steps, self.step + stop_after)
        took = self._take_lock()
        try:
            return self._run(end, stop_after, handle_interrupt)
        finally:
            if took:
                self._lock.release()

    def _run(self, end: int, stop_after: int | None, handle_interrupt: bool) -> list[dict]:
        cfg = self.config
        bar = self._bar(end)
        rate = 0.0
        with self._interrupts(handle_interrupt), contextlib.closing(bar or _NoBar()):
            while self.step < end:
                t0 = time.perf_counter()
                loss = self.train_step()
                dt = time.perf_counter() - t0
                self.elapsed_s += dt
                tps = cfg.batch_size * self.model.config.block_size / max(dt, 1e-9)
                rate = tps if rate == 0 else 0.9 * rate + 0.1 * tps
                if self.step % cfg.eval_interval == 0 or self.step == cfg.max_steps:
                    val = self.evaluate()
                    if not math.isfinite(val):
                        raise self._diverged(f"the validation loss is {val}", self.step,
                                             self.history[-1]["lr"])
                    self.val_history.append({"step": self.step, "val_loss": val})
                    self.save()
                    if self.parallel is None or self.parallel.is_main:
                        for hook in self.on_eval:
                            hook(self)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(self._postfix(loss, rate), refresh=False)
                if self._stop_agreed if self.parallel is not None else self._stop_requested:
                    self._stop_requested = self._stop_agreed = False
                    if self._saved_step != self.step:
                        self.save()
                    raise KeyboardInterrupt
        if stop_after is not None:
            self.save()
        return self.history

    def state(self) -> dict:
        return {"step": self.step, "history": self.history, "val": self.val_history,
                "tokens_seen": self.tokens_seen, "elapsed_s": self.elapsed_s}

    def save(self) -> Path | None:
        """Write the checkpoint (rank 0 only across processes; the others wait until it has
        committed, and all raise if it failed)."""
        if self.out is None:
            return None
        par = self.parallel
        error = None
        if par is None or par.is_main:
            try:
                with self.locked():  # a save outside `run` holds the lock while it writes
                    tensors = {k: v.cpu() for k, v in trainer_tensors(self.optimizer).items()}
                    save_checkpoint(self.out, self.model, self.tokenizer,
                                    train_config=self.config, state=self.state(),
                                    trainer_tensors=tensors)
            except (AttnlabError, OSError) as e:
                error = e
        if par is not None and not par.all_ok(error is None) and error is None:
            err = AttnlabError(f"checkpoint: rank 0 could not save to {self.out} (see its "
                               f"message); the checkpoint of step {self._saved_step} is kept")
            err.every_rank = True
            raise err
        if error is not None:
            raise error
        self._saved_step = self.step
        return self.out

    # -- internals -----------------------------------------------------------------------------

    def _take_lock(self, *, agree: bool = True) -> bool:
        """Take the run directory's lock (one process, or rank 0) unless it is held already;
        True when this call took it (the caller releases it). With `agree`, every rank learns
        whether rank 0 got it, so a refused run stops on every rank at once."""
        error = None
        took = self._lock is not None and not self._lock.held
        if took:
            try:
                self._lock.acquire()
            except AttnlabError as e:
                error, took = e, False
        if agree and self.parallel is not None and not self.parallel.all_ok(error is None):
            error = error or AttnlabError(f"out: rank 0 could not lock {self.out} (see its "
                                          "message)")
            error.every_rank = True
        if error is not None:
            raise error
        return took

    @contextlib.contextmanager
    def locked(self):
        """Hold the run directory's lock while the block runs (`run` and `save` inside it keep
        it); AttnlabError naming the holder when another process has it. Across processes only
        rank 0 locks, with no collective."""
        took = self._take_lock(agree=False)
        try:
            yield
        finally:
            if took:
                self._lock.release()

    def _postfix(self, loss, rate):
        post = {"loss": f"{loss:.3f}", "tok/s": f"{rate:,.0f}"}
        if self.val_history:
            post["val"] = f"{self.val_history[-1]['val_loss']:.3f}"
        return post

    def _bar(self, end):
        if not self.progress:
            return None
        try:
            from tqdm import tqdm
        except ImportError:  # the bar is a nicety: train without it
            return None
        return tqdm(total=end, initial=self.step, desc="train", unit="step", file=sys.stderr,
                    dynamic_ncols=True)

    @contextlib.contextmanager
    def _interrupts(self, enabled: bool):
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return

        previous = signal.signal(signal.SIGINT, lambda signum, frame: self.request_stop())
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _diverged(self, what: str, step: int, lr: float) -> AttnlabError:
        if self.out is None:
            kept = ""
        elif self._saved_step is None:
            kept = f"; nothing was saved to {self.out}"
        else:
            kept = f"; {self.out} keeps its checkpoint of step {self._saved_step}"
        err = AttnlabError(f"{what} at step {step} (lr {lr:.3g}): training diverged and was "
                           f"stopped without saving{kept}; lower the learning rate (lr) or raise "
                           "warmup_steps")
        err.every_rank = self.parallel is not None  # the loss is global: all ranks stop here
        return err


class _NoBar:
    def close(self):
        pass


def _resume_state(meta: Path, state: dict) -> dict:
    """The training state of attnlab.json, checked before a resumed run relies on it."""
    kinds = {"history": list, "val": list, "tokens_seen": int, "elapsed_s": (int, float)}
    for key, kind in kinds.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise AttnlabError(f"checkpoint: {meta}: 'state.{key}' is missing or not a "
                               f"{'list' if kind is list else 'number'} (got "
                               f"{state.get(key)!r:.80})")
    for key, field in (("history", "loss"), ("val", "val_loss")):
        for i, entry in enumerate(state[key]):
            if not (isinstance(entry, dict) and _is_number(entry.get(field))
                    and _is_number(entry.get("step"))):
                raise AttnlabError(f"checkpoint: {meta}: 'state.{key}[{i}]' must be an object "
                                   f"with numbers 'step' and '{field}', got {entry!r:.80}")
    return state


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
