"""A loaded profile at work: sessions, one-shot answers, chat, the terminal view and the run
history (store, report)."""
