"""Operator commands: ``kvroute tail`` (watch a stream) and ``kvroute demo``."""
