"""What a fit returns and everything read off it: the Posterior, chains, predictive draws, held-out
scores, metrics, uncertainty, diagnostics, ArviZ export and persistence."""
