import os

# Tests never reach a model hub: everything runs on models built or shipped locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Tiny models gain nothing from threads, and several OpenMP threads per process thrash a
# small shared machine (spin-waiting): one thread keeps the suite fast and steady.
torch.set_num_threads(1)
