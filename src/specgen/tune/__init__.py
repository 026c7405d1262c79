"""`specgen tune`: search the sub-layers a target skips when it drafts for itself (method
"self"), scoring each candidate by the measured speed of real speculative decoding."""
