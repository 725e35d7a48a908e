"""Stage 'diagnose': pure functions from evidence to a verdict. Nothing here shells out or reads
files.
"""
