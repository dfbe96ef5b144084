"""Evaluation: routing-prediction recall and student-vs-teacher quality."""
