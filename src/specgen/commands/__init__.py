"""Each command's flow, one module per verb: what `specgen VERB` does once cli/ has parsed
its options (run, chat, bench, serve, export, tune, heads, stats, profiles, cache). A flow
that loads models is handed cli's loader (`load_session`, behind a status line)."""
