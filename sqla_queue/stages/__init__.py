"""Batch stages: work a claimed batch needs outside its transaction."""
