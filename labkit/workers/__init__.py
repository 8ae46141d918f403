"""Rank entry points, each run as ``torchrun ... -m labkit.workers.NAME --config JSON --out PATH``.

Keep this file empty of imports: the launcher checks that a worker exists without importing torch.
"""
