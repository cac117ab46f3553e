"""Evaluation: pass@k / mean@k / maj@k math (`metrics`, pure numpy) and the sampling-and-scoring run
behind scripts/evaluate.py (`runner`)."""
