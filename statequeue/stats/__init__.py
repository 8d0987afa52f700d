"""Figures over finished attempts: quantile sketches, histograms, rates and the `stats` summary.
Below the stores, which feed it."""
