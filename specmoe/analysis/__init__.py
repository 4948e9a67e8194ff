"""Analyses of recorded runs beyond the prediction chain: routing inertia of rejected drafts
(paper 003 Appendix H) and where the Oracle stops (paper 000 Appendix B). Numpy only."""
