"""From a profile to loaded models: find the files (sources), verify and convert them
(convert), check memory (memory), place them (devices) and load them (load)."""
