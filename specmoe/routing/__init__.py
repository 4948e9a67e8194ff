"""Routing: traces, their statistics, maximum-entropy prediction and synthetic routing.

numpy and scipy only: nothing here imports torch.
"""
