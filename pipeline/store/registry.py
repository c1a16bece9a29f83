"""The memory rules (pipeline/registry.py): which maps of a class the class memory keeps (extract.memory). A new
rule is its function in pipeline/store/memory.py plus one line here."""

from __future__ import annotations

from pipeline.registry import Registry

MEMORY_RULES = Registry("memory rule", {
    "mean": ("pipeline.store.memory:mean_rule", "eq. memory: each class's mean map"),
    "random": ("pipeline.store.memory:random_rule", "one map of each class drawn at random (ours)"),
    "sampled": ("pipeline.store.memory:sampled_rule", "memory_k maps of each class drawn at random (ours)"),
})
