"""Reading training curves: plateaus, the grokking-vs-more-data sweep at equal compute, the
large-data arm, importers of other trainers' logs, and their figures.

Prevents the misreadings a curve invites: calling a still-improving run converged, comparing
arms that processed different numbers of tokens, or numbers defined differently.
"""
