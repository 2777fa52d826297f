"""Moved to rules/strategies.py (the package's rule checker uses them); re-exported here for the property tests."""
from rules.strategies import (SHAPES, Graph, graphs, movement, contiguous_movement, rule_graphs, factorizations,  # noqa: F401
                              reference_values, executed_values, random_data)
