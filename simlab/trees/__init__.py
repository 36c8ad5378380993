"""Draft trees: the typed structure a tree round proposes, and how greedy verification answers it."""
