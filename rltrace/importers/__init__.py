"""Bringing logs that runs already wrote into a run store (`rltrace import ...`)."""
