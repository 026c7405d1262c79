"""Model trees specgen builds itself, without transformers' model code (llama.py): importing
that code is a large share of a command's start, and the lean decoder needs none of its
forward."""
