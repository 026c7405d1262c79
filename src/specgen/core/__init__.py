"""The speculative loop and its math: sampling (pure tensor functions), drafters, the K
policy (adaptive), the engine, and the plain-data statistics of a run."""
