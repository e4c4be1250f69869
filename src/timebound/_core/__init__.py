"""The deadline model: clock, deadline value, errors, scopes, context inheritance, and the
request being served (which an operation cut by its deadline marks, D4.5, D4.10).

Standard library only. Everything above this package computes its budget through it.
"""
