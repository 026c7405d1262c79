"""A loaded profile at work, what the commands share: sessions, one-shot answers, the terminal
view and the error console (render), the run history (store, report) and the skip sets of
method "self" (skipsets)."""
