"""Model trees specgen builds itself, without transformers' model code (llama.py): importing
that code costs more than importing torch and transformers together, and the lean decoder
needs none of its forward."""
