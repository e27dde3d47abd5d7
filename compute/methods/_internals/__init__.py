"""Shared machinery of the methods: the Method interface, capture-based decomposition algebra, aggregation over
layers, the gradient pass and the LRP rules. No registered method lives here (one file per method in the parent)."""
