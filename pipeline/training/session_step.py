"""One SGD step of an incremental session (paper eq. optim_inc): its objective on a batch, the draws of every step
made before the first (rows, feature-mixup partners, lent deviations), the step itself, and the read-back of its
losses. `incremental_session.fit_session` runs these steps; nothing here reads the device back during a step.
"""

from __future__ import annotations

import torch

from pipeline.data.mixing import FEATURE_MIXUP_RATIO, deviation_draws, feature_mixup, mixup_draws
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.losses.class_sensitive import separation_loss, suppression_loss
from pipeline.losses.classification import mixed_loss, target_weights
from pipeline.losses.registry import SUPPRESSION_TARGETS, Z_CHANNEL_FLIP
from pipeline.models.projector import suppression_target
from pipeline.models.registry import HEADS, MAMBA_1D
from pipeline.precision import autocast
from pipeline.training.progress import drain


def incremental_loss(projector, classifier, x: torch.Tensor, y: torch.Tensor, is_base: torch.Tensor, num_seen: int,
                     classifier_kind: str, inc, mix_perm: torch.Tensor | None,
                     frozen: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """The three terms of eq. optim_inc on one batch: (classification on feature-mixed mu, suppression (eq.
    loss_supp), separation (eq. loss_sep)) in the forms incremental.* names, the class-sensitive ones per loss group;
    a term whose weights are zero is an exact 0. mix_perm: the batch's feature-mixup partners (None: not mixed);
    frozen: the batch's (mu_iden, mu_base) when p_iden and g_base are frozen (`Projector.frozen_outputs`)."""
    out = projector.session_outputs(x, frozen, base_aux=bool(inc.lambda3_base))
    mu, y_a, y_b, lam = feature_mixup(out.mu, y, FEATURE_MIXUP_RATIO, mix_perm)
    head = HEADS[classifier_kind]
    cls = mixed_loss(head.loss, classifier(mu, num_seen), y_a, y_b, lam, scale=head.loss_scale(inc.dr_scale),
                     weights=target_weights(inc.dr_weighting, y_a, y_b, num_seen))
    supp = sep = torch.zeros((), device=x.device)
    if inc.suppression_on:
        target = SUPPRESSION_TARGETS[suppression_target(projector.kind, inc.suppression)](out.aux, out.mu_inc)
        if target is None:
            raise FSCILError(f"params: incremental.suppression={inc.suppression} needs "
                             + (f"model.ssm_branch {MAMBA_1D}" if inc.suppression == Z_CHANNEL_FLIP
                                else "a projector with g_inc"))
        supp = suppression_loss(target, is_base, inc.lambda1, inc.lambda2, inc.suppression_form, inc.loss_groups)
    forms = (inc.separation_form, inc.separation_delta, inc.separation_paths, inc.loss_groups)
    for weight, aux in ((inc.lambda3, out.aux), (inc.lambda3_base, out.aux_base)):
        if weight:
            sep = sep + weight * separation_loss(aux, is_base, *forms)
    return cls, supp, sep


def session_batch(rows: int, batch_size: int, groups: int) -> int:
    """The rows of a session step: batch_size, or with fewer training rows all of them, rounded up to whole loss
    groups (padded as in SessionDraws)."""
    batch = min(batch_size, rows)
    return batch + -batch % groups


class SessionDraws:
    """Every random draw of a session's steps, made before the first step (in the order the steps would make them,
    so a seed gives the same run) and moved to the device once: the steps then read no host data and wait for
    nothing. Per step: the batch's rows (a fresh permutation of the training set each epoch, drop_last), the
    feature-mixup partners or None, and the lent-deviation draws or None.

    A batch larger than the training set (fewer rows than incremental.batch_size, rounded up to whole loss groups)
    is the epoch's permutation followed by its first rows again: the authors' distributed sampler padded each epoch
    to a multiple of their 8 GPUs this way, so every GPU (here: loss group) held as many rows."""

    def __init__(self, gen: torch.Generator, rows: int, steps: int, batch: int, mixup_prob: float, device,
                 deviations: tuple[float, int, torch.Generator] | None = None, groups: int = 1):
        per_epoch = max(rows // batch, 1)
        idx, perms, self.mixed = [], [], []
        order = torch.zeros(0, dtype=torch.long)
        for step in range(steps):
            if step % per_epoch == 0:
                order = torch.randperm(rows, generator=gen)
                if batch > rows:  # padded with the permutation's first rows
                    order = order[torch.arange(batch) % rows]
            idx.append(order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch])
            perm = mixup_draws(batch, mixup_prob, gen, groups)
            self.mixed.append(perm is not None)
            perms.append(perm if perm is not None else torch.arange(batch))
        stacked = (torch.stack(idx), torch.stack(perms)) if steps else (torch.zeros(0, batch, dtype=torch.long),) * 2
        self.idx, self.perms = (t.to(device) for t in stacked)
        self.lent = None
        if deviations is not None and steps:
            prob, count, dev_gen = deviations
            chosen, pick = zip(*(deviation_draws(batch, prob, count, dev_gen) for _ in range(steps)), strict=True)
            self.lent = (torch.stack(chosen).to(device), torch.stack(pick).to(device))

    def step(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, tuple | None]:
        """(rows, mixup partners or None, lent-deviation draws or None) of step `step`."""
        lent = None if self.lent is None else (self.lent[0][step], self.lent[1][step])
        return self.idx[step], (self.perms[step] if self.mixed[step] else None), lent


def train_step(projector, classifier, opt, trainable: list, batch: tuple, num_seen: int, classifier_kind: str, inc,
               mix_perm: torch.Tensor | None, frozen=None, precision: str = "fp32") -> torch.Tensor:
    """One SGD step of eq. optim_inc on batch (x, y, is_base); returns the detached (loss, cls, supp, sep) on the
    device, float32. Nothing here reads a value back to the host (tests/test_session_readback.py patches the reads).
    precision bf16: the forward pass under autocast (`pipeline.precision`)."""
    with autocast(batch[0].device, precision):
        terms = incremental_loss(projector, classifier, *batch, num_seen, classifier_kind, inc, mix_perm, frozen)
    cls, supp, sep = (t.float() for t in terms)
    loss = cls + supp + sep  # eq. optim_inc
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if inc.grad_clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(trainable, inc.grad_clip_norm)
    opt.step()
    return torch.stack([loss, cls, supp, sep]).detach()


def read_back(pending: list[torch.Tensor], history: dict[str, list[float]], session: int, done: int) -> None:
    """Move the last steps' (loss, cls, supp, sep) rows into `history` (one wait for the device instead of one per
    step) and stop at the first non-finite loss among them. `done`: steps done so far."""
    values, bad = drain(pending, done)
    if bad is not None:
        raise TrainingDiverged(f"session {session}: non-finite loss at step {bad}; nothing written (lower "
                               "incremental.lr or lambda1, or set incremental.grad_clip_norm)")
    for row in values:
        for key, value in zip(("loss", "cls", "supp", "sep"), row, strict=True):
            history[key].append(round(value, 6))


def frozen_rows(frozen: tuple[torch.Tensor, torch.Tensor] | None, idx) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows `idx` (an index tensor or a slice) of `Projector.frozen_outputs`' pair, or None."""
    return None if frozen is None else (frozen[0][idx], frozen[1][idx])
