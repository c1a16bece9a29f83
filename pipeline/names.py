"""The names the config accepts for each registry, free of torch: the config checks values against these without
importing models, losses or kernels (so the DVC `config` stage depends on the config code alone). Each registry is
keyed by exactly these names (tests/test_layers.py); a new backbone, projector, head, memory rule or suppression
target is added to its registry and here."""

BACKBONES = ("resnet12", "resnet18", "vit_b16", "swin_t")  # pipeline.models.backbones.BACKBONES
PROJECTORS = ("dual_ssm", "single_ssm", "mlp", "s4", "transformer", "gru", "lstm", "expanding_mlp")  # PROJECTOR_KINDS
HEADS = ("etf", "linear")  # pipeline.models.classifier.HEADS
MEMORY_KINDS = ("mean", "random", "sampled")  # pipeline.store.memory: eq. memory and our two rules
SUPPRESSION_TARGETS = ("z", "silu_z", "mu_inc", "z_channel_flip")  # pipeline.losses.class_sensitive
SSM_BRANCHES = ("ss2d", "mamba_1d")  # pipeline.models.mixers.SSM_BRANCHES
# the forms in which the paper's text and the authors' code differ (pipeline.losses, pipeline.training.schedule);
# the first of each is the paper's text
SUPPRESSION_FORMS = ("squared_mean", "norm_per_element")  # pipeline.losses.class_sensitive.SUPPRESSION_FORMS
SEPARATION_FORMS = ("abs_cos", "confusion_mean")  # pipeline.losses.class_sensitive.SEPARATION_FORMS
SEPARATION_DELTAS = ("delta", "dt_low")  # pipeline.losses.class_sensitive.SEPARATION_DELTAS
SEPARATION_PATHS = ("all", "first")  # pipeline.losses.class_sensitive.SEPARATION_PATHS
DR_WEIGHTINGS = ("uniform", "class_balanced")  # pipeline.losses.classification.DR_WEIGHTINGS
SCHEDULES = ("warmup_cosine", "mmcv_cosine_cooldown")  # pipeline.training.schedule.SCHEDULES
BASE_SCHEDULES = (*SCHEDULES, "mmcv_step")  # pipeline.training.schedule.BASE_SCHEDULES
ATTENTION_HEADS = 8  # the appendix's 8-head Transformer mixer (pipeline.models.mixers)
SCAN_CHOICES = ("auto", "torch", "triton", "mamba")  # params scan: pipeline.ops.selective_scan.set_scan
