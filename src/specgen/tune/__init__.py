"""The search behind `specgen tune` (commands/tune.py): which sub-layers a target skips when
it drafts for itself (method "self"), apart from any model (search.py)."""
