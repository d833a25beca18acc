"""Profiles attached to slow stages: py-spy and torch.profiler captures tied to their spans (issue 6)."""
