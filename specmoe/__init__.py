"""specmoe: speculative decoding on Mixture-of-Experts models, measured and predicted.

Routing traces -> reuse and union statistics -> bytes per kernel -> effective bandwidths ->
verify times, the dedup crossover, the best draft length staircase and the speedup, each with
its error bound; then real speculative runs that score the prediction.
"""

__version__ = "0.1.0"
