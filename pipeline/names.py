"""The names the config accepts for each registry, free of torch: the config checks values against these without
importing models, losses or kernels (so the DVC `config` stage depends on the config code alone). Each registry is
keyed by exactly these names (tests/test_layers.py); a new backbone, projector, head, memory rule or suppression
target is added to its registry and here."""

BACKBONES = ("resnet12", "resnet18", "vit_b16", "swin_t")  # pipeline.models.backbones.BACKBONES
PROJECTORS = ("dual_ssm", "single_ssm", "mlp", "s4", "transformer", "gru", "lstm", "expanding_mlp")  # PROJECTOR_KINDS
HEADS = ("etf", "linear")  # pipeline.models.classifier.HEADS
MEMORY_KINDS = ("mean", "random", "sampled")  # pipeline.store.memory: eq. memory and our two rules
SUPPRESSION_TARGETS = ("z", "silu_z", "mu_inc")  # pipeline.losses.class_sensitive.SUPPRESSION_TARGETS
ATTENTION_HEADS = 8  # the appendix's 8-head Transformer mixer (pipeline.models.mixers)
SCAN_CHOICES = ("auto", "torch", "triton", "mamba")  # params scan: pipeline.ops.selective_scan.set_scan
