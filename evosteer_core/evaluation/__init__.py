"""Evaluation: score tables and the AUC rank statistic."""
