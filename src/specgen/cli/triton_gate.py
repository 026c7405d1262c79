"""Triton only where a GPU kernel will run.

transformers imports torch's compiler, which imports Triton whenever it is installed (the test
extra installs it for the kernels' interpreter). On a CPU nothing runs it, yet its bindings
print about a thousand `nanobind: leaked ...` lines when the process exits, after the
command's last line. The commands therefore keep Triton out of a process that has no CUDA
device and no interpreter asked for (TRITON_INTERPRET=1): `import triton` then fails as if it
were not installed, which every importer of it handles (torch's compiler takes it as absent;
kernels.gpu.available says no on such a device before it asks)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys


class _Refused(importlib.abc.Loader):
    def create_module(self, spec):  # noqa: ANN001 (importlib's signature)
        raise ModuleNotFoundError("Triton is kept out of a process without a CUDA device",
                                  name=spec.name)

    def exec_module(self, module) -> None:  # noqa: ANN001
        raise AssertionError("unreachable: create_module refuses")


class _TritonGate(importlib.abc.MetaPathFinder):
    """Finds `triton` as a module that refuses to load where no GPU kernel can run (so that
    `importlib.util.find_spec` still answers without raising); elsewhere steps aside."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if name != "triton" or _runs_here():
            return None  # the usual finders go on
        return importlib.machinery.ModuleSpec(name, _Refused())


def _runs_here() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch  # already imported by whoever asks for Triton (transformers, torch itself)

    return torch.cuda.is_available()


def install() -> None:
    """Put the gate first on the import path, once per process."""
    if not any(isinstance(f, _TritonGate) for f in sys.meta_path):
        sys.meta_path.insert(0, _TritonGate())
