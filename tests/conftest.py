import os

# Tests never reach a model hub: everything runs on models built or shipped locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
