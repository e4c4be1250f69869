"""The deadline model: clock, deadline value, errors, scopes and context inheritance.

Standard library only. Everything above this package computes its budget through it.
"""
