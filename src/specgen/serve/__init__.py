"""The HTTP server behind `specgen serve` (commands/serve.py): the loaded pair behind OpenAI-
and Ollama-compatible APIs (validate, worker, openai_api, ollama_api, common, metrics, app,
server)."""
