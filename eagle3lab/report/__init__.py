"""Batch reports: the pipeline's stages over one work directory and the notebooks run with
papermill, rendered to HTML and indexed.

Prevents the unshareable research run: a stage computed by hand, a notebook that failed
half-way unnoticed, numbers nobody can trace to their parameters and versions.
"""
