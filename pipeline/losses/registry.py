"""The loss registries (pipeline/registry.py): what the class-sensitive losses act on and their forms, and the DR
loss's sample weights. Where the paper's text and the authors' code differ, each is a named form (the paper's
first); a new form is its function in pipeline/losses/ plus one line here."""

from __future__ import annotations

from pipeline.registry import Registry

# incremental.suppression: what eq. loss_supp suppresses (on gating designs; the others: g_inc's output)
Z_CHANNEL_FLIP = "z_channel_flip"  # only the 1-D branch has it (models/registry.py MAMBA_1D)
SUPPRESSION_TARGETS = Registry("suppression target", {
    "z": ("pipeline.losses.class_sensitive:target_z", "the gate stream Z (the paper)"),
    "silu_z": ("pipeline.losses.class_sensitive:target_silu_z", "SiLU(Z), the gate"),
    "mu_inc": ("pipeline.losses.class_sensitive:target_mu_inc", "g_inc's output mu_inc"),
    Z_CHANNEL_FLIP: ("pipeline.losses.class_sensitive:target_z_channel_flip",
                       "the authors' 1-D branch: the orders' Z summed with the channel axis flipped"),
})

# incremental.suppression_form: S in eq. loss_supp, per loss group
SUPPRESSION_FORMS = Registry("suppression form", {
    "squared_mean": ("pipeline.losses.class_sensitive:suppression_squared_mean",
                     "the paper: mean of ||Z_i||^2 / (L D')"),
    "norm_per_element": ("pipeline.losses.class_sensitive:suppression_norm_per_element",
                         "the authors: ||Z_group||_F / its element count"),
})

# incremental.separation_form: the separation of the base and novel means in eq. loss_sep
SEPARATION_FORMS = Registry("separation form", {
    "abs_cos": ("pipeline.losses.class_sensitive:separation_abs_cos", "the paper: |cos| of the two means"),
    "confusion_mean": ("pipeline.losses.class_sensitive:separation_confusion_mean",
                       "the authors: mean |I - S| of the 2 x 2 cosines (|cos| / 2)"),
})

# incremental.separation_delta: which generated tensor stands for Delta in eq. loss_sep (its key in the branch's aux)
SEPARATION_DELTAS = Registry("separation Delta", {
    "delta": ("delta", "the paper: softplus(dt_proj(dt) + b), D_inner wide"),
    "dt_low": ("dt_low", "the authors: the low-rank dt before dt_proj"),
}, lazy=False)

# incremental.separation_paths: which scan paths the means of eq. loss_sep average
SEPARATION_PATHS = Registry("separation path choice", {
    "all": (slice(None), "the paper: all K paths"),
    "first": (slice(0, 1), "the authors' 1-D branch: the first token order's only"),
}, lazy=False)

# base.mix_loss: the head's loss on a Mixup / CutMix batch of the base training (eq. optim_base)
BASE_MIX_LOSSES = Registry("mixed-batch loss", {
    "lam_weighted": ("pipeline.losses.classification:mix_loss_lam_weighted",
                     "the paper: lam L(y_a) + (1 - lam) L(y_b)"),
    "lam_weighted_plus_a": ("pipeline.losses.classification:mix_loss_lam_weighted_plus_a",
                            "the authors: lam L(y_a) + (1 - lam) L(y_b) + L(y_a)"),
})

# incremental.dr_weighting / base.dr_weighting: each sample's weight in the DR loss
DR_WEIGHTINGS = Registry("DR weighting", {
    "uniform": ("pipeline.losses.classification:uniform_weights", "the paper: the plain mean"),
    "class_balanced": ("pipeline.losses.classification:class_balance_weights",
                       "the authors' with_len: every class in the batch weighs the same"),
})
