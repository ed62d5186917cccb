"""Baselines TokMem is compared with, each training and answering like TokMem does."""
