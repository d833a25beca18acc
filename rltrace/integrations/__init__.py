"""Hooks into the frameworks people train with; one module per framework (docs/integrations.md).

The core never imports these: users import them by name (`rltrace.integrations.trl.instrument`)
and the `rltrace run` launcher finds them through the `rltrace.instrumentors` entry point.
"""
