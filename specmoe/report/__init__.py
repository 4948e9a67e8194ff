"""Figures and the HTML report. Figure modules import matplotlib only inside their functions."""
