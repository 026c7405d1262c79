"""The speculative loop and its math: sampling (pure tensor functions), drafters, the
planner (adaptive), the engine, and the plain-data statistics of a run."""
