"""The offline Oracle and online draft-budget policies (paper 000), on round logs.

numpy and scipy only at import time; statsmodels, scikit-learn and pyarrow enter inside the
functions that need them.
"""
