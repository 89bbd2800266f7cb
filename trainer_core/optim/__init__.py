"""Optimizer update rules (a leaf: any layer may use it, it uses none of them)."""
