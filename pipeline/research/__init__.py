"""Research tools built on the method library (pipeline/*): hyper-parameter selection on pseudo-incremental
protocols (`selection`, `pseudo_pack`), seeded studies of variants (`study`), and measurements of the models
(`benchmark`: timings and cost curves, `summary`: parameter tables). Imports flow one way: stages -> research ->
pipeline; nothing in the method library imports from here (tests/test_layers.py)."""
