"""Framework hooks: each module attaches markers to one framework when it is imported."""
