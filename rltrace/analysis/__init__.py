"""Analyses of a run as plain functions returning tables (issue 4)."""
