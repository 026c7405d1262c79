"""`specgen bench`: contestants run interleaved on one model pair (runner), their figures
(report), the built-in prompt set (prompts) and the command's flow (command)."""
