"""Mamba-FSCIL library: models, ops, losses, data, feature store and training loops.

Nothing here reads params.yaml or parses the command line: that is `stages/`' job.
"""
