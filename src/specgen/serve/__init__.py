"""`specgen serve` and `specgen export`: the loaded pair behind OpenAI- and Ollama-compatible
HTTP APIs (validate, worker, openai_api, ollama_api, metrics, app, server), and a profile as
vLLM and llama.cpp command lines (export)."""
