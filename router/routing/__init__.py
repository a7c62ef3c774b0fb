"""Routing: policies, in-flight state and the decision core over score results."""
