"""The causal-LM predictor: prompts -> the run's tokenizer and prompt format -> generated responses.

It fits checkpoints of task ``causal_lm`` (``addition``, ``prompt_response``, ``lm_text``). A prompt goes through
what the run's data went through: a chat-style ``messages`` list is rendered with the tokenizer's chat template
(or the plain ``role: content`` fallback the data source uses), the text is tokenised without special tokens and
BOS is put first when the tokenizer has one. The tokenizer is the run's own: a tokenizer teachkit built (``char``,
``byte``, ``bpe``) is read from the ``tokenizer.json`` its run wrote into the run folder (or an export folder), a
pretrained one is loaded offline by the name the data section records; its vocabulary's sha256 must be the one
the checkpoint records.

:meth:`CausalLMPredictor.generate` answers with greedy search by default, or beam search, or sampling (seeded),
batched with the key/value cache, at most ``max_new_tokens`` tokens (default: the run's data setting), and returns
the decoded responses (special tokens dropped, generation stopped at EOS). ``predict`` is ``generate``;
:meth:`CausalLMPredictor.perplexity` scores whole texts. ``teachkit export`` adds a Hugging Face folder (``hf/``:
``AutoModelForCausalLM`` + the tokenizer; LoRA adapters merged) and, for a LoRA student, the adapter alone
(``adapter/``: ``adapter_config.json``, ``adapter_model.safetensors``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teachkit.data.lm import CAUSAL_LM, LMInfo, LMText
from teachkit.data.lm_sources import Item, Side, encode_text, render_prompt, with_bos
from teachkit.data.lm_tokenizers import from_json, special_ids, vocab_digest
from teachkit.data.text import load_tokenizer
from teachkit.data.translation_files import read_lines
from teachkit.errors import CheckpointError, ConfigError, DataError
from teachkit.models.causal_lm import causal_lm_of, save_adapter, save_pretrained
from teachkit.models.lm_generate import GenerateOptions, generate_rows
from teachkit.predict.base import Predictor, recorded_task, register_predictor
from teachkit.predict.text import data_options

#: the tokenizer files a run keeps when teachkit built its tokenizer (``tokenizer_artifacts``)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
BUILT = ("char", "byte", "bpe")


@register_predictor
class CausalLMPredictor(Predictor):
    """Prompts in, generated responses out (module docstring)."""

    row_label = "prompt"

    @classmethod
    def handles(cls, state: dict[str, Any]) -> bool:
        return recorded_task(state) == CAUSAL_LM

    def __init__(self, model: torch.nn.Module, state: dict[str, Any], source: Path,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(model, state, source, device)
        self.task, self.class_names = CAUSAL_LM, None
        self.options = data_options(state)
        self.tokenizer_folder: Path | None = None
        self.tokenizer = self._tokenizer()
        self.pad_id, self.eos_id, self.bos_id = special_ids(self.tokenizer)
        self.max_length = int(self.options.get("max_length") or 512)
        limit = self.options.get("max_new_tokens")
        self.max_new_tokens = int(limit) if isinstance(limit, int) and limit >= 1 else 64
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        self.batch_size = int(data.get("eval_batch_size") or 64)

    # -- the tokenizer ------------------------------------------------------------------------------------------
    def _tokenizer(self) -> Any:
        """The run's tokenizer, checked against the vocabulary digest the checkpoint records."""
        name = str(self.options.get("tokenizer") or "bpe")
        base = self.source if self.source.is_dir() else self.source.parent
        folder = next((f for f in (base, base.parent) if (f / "tokenizer.json").is_file()), None)
        if folder is not None and (name in BUILT or not Path(name).expanduser().is_dir()):
            self.tokenizer_folder = folder
            tok = from_json((folder / "tokenizer.json").read_text(encoding="utf-8")) if name in BUILT else \
                load_tokenizer(str(folder))
        elif name in BUILT:
            raise CheckpointError(f"no tokenizer.json beside {str(self.source)!r}: a causal LM whose run built its "
                                  f"tokenizer ({name!r}) needs the tokenizer files its run wrote (the run folder, or "
                                  "an export folder made by teachkit export)")
        else:
            tok = load_tokenizer(name)
        recorded = self.state.get("tokenizer")
        digest = vocab_digest(tok)
        if isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str) and recorded["sha256"] != digest:
            raise CheckpointError(f"the tokenizer found for {str(self.source)!r} is not the one the model was trained "
                                  f"with (vocabulary sha256 {digest[:12]}, the checkpoint records "
                                  f"{recorded['sha256'][:12]})")
        return tok

    # -- inputs ------------------------------------------------------------------------------------------------
    def prompts(self, inputs: Any) -> list[Item]:
        """``inputs`` as prompt items: a string, a ``messages`` list (dicts with ``role`` and ``content``), a list
        of either, or a file given as a ``Path``."""
        if isinstance(inputs, Path):
            inputs = self.read_inputs(inputs)[0]
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], dict)):
            inputs = [inputs]
        items = []
        for i, value in enumerate(list(inputs), 1):
            if isinstance(value, str) and value:
                items.append(Item("", "input", i, prompt=value))
            elif isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                           and isinstance(m.get("content"), str) for m in value):
                items.append(Item("", "input", i, messages=[{"role": m["role"], "content": m["content"]}
                                                             for m in value]))
            else:
                raise DataError(f"input {i} is {str(value)[:60]!r}: a causal LM takes a non-empty prompt string or a "
                                "list of messages ({role, content})")
        return items

    def encode(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt ids (N, P) int64 right-padded, prompt lengths (N,)) as the run's data encodes prompts."""
        side = Side.of("tokenizer", str(self.options.get("tokenizer")), self.tokenizer)
        items = self.prompts(inputs)
        texts = [render_prompt("input", item, side) for item in items]
        rows = [with_bos(ids, self.bos_id) for ids in encode_text(self.tokenizer, texts)]
        for item, ids in zip(items, rows, strict=True):
            if len(ids) >= self.max_length:
                raise DataError(f"input {item.line} is {len(ids)} tokens long, at least the run's max_length="
                                f"{self.max_length}: no room for a response")
        width = max((len(r) for r in rows), default=1)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return ids.to(self.device), torch.tensor([len(r) for r in rows], device=self.device)

    def preprocess(self, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode(inputs)

    def read_inputs(self, path: Path) -> tuple[Any, list[str]]:
        """A ``.txt`` file (one prompt per line, blank lines skipped) or a ``.jsonl`` file (records with ``prompt``
        or ``messages``); the prompts and their line numbers."""
        if not path.is_file():
            raise DataError(f"input {str(path)!r} is not a file (expected one prompt per line, or JSON Lines)")
        lines = [(n, line) for n, line in enumerate(read_lines(path, "causal LM input"), 1) if line.strip()]
        if path.suffix.lower() not in (".jsonl", ".ndjson"):
            return [line for _, line in lines], [str(n) for n, _ in lines]
        out = []
        for n, line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                raise DataError(f"{str(path)!r} line {n}: not JSON") from None
            value = record.get("messages", record.get("prompt")) if isinstance(record, dict) else None
            if value is None:
                raise DataError(f"{str(path)!r} line {n}: a record needs a 'prompt' or 'messages' field")
            out.append(value)
        return out, [str(n) for n, _ in lines]

    # -- outputs -----------------------------------------------------------------------------------------------
    def options_for(self, decode: str, max_new_tokens: int | None, beam: int, temperature: float, top_k: int,
                    top_p: float) -> GenerateOptions:
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if decode not in ("greedy", "beam", "sample"):
            raise ConfigError(f"decode={decode!r} is not allowed; choose greedy, beam or sample")
        return GenerateOptions(strategy=decode, max_new_tokens=limit, beam=beam, temperature=temperature,
                               top_k=top_k, top_p=top_p)

    def generate(self, prompts: Any, max_new_tokens: int | None = None, decode: str = "greedy", beam: int = 4,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> list[str]:
        """The model's response to each prompt (module docstring); sampling draws from a generator seeded by
        ``seed``, so the same call gives the same responses."""
        ids, lengths = self.encode(prompts)
        options = self.options_for(decode, max_new_tokens, beam, temperature, top_k, top_p)
        generator = torch.Generator(device="cpu").manual_seed(seed) if decode == "sample" else None
        responses, _ = generate_rows(self.model, ids, lengths, options, eos_id=self.eos_id, pad_id=self.pad_id,
                                     batch_size=self.batch_size, generator=generator)
        info = self.info()
        return [info.text(r) for r in responses]

    def info(self) -> LMInfo:
        return LMInfo(tokenizer=self.tokenizer, tokenizers={}, pad_id=self.pad_id, eos_id=self.eos_id,
                      bos_id=self.bos_id, kind="prompt_response", max_length=self.max_length,
                      max_new_tokens=self.max_new_tokens)

    @torch.no_grad()
    def perplexity(self, texts: Any) -> list[float]:
        """exp(mean token NLL) of each text under the model (BOS first; every token after the first scored)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        rows = [with_bos(ids, self.bos_id)[:self.max_length] for ids in encode_text(self.tokenizer, texts)]
        if any(len(r) < 2 for r in rows):
            raise DataError("perplexity needs texts of at least one token after BOS")
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        lengths = torch.tensor([len(r) for r in rows])
        x = LMText(ids, lengths, torch.ones_like(lengths), torch.arange(len(rows)), self.info()).to(self.device)
        logits = self.model(x).float()
        nll = torch.nn.functional.cross_entropy(logits, x.token_targets(), reduction="none")
        out, start = [], 0
        for n in x.tgt_lengths().tolist():
            out.append(float(torch.exp(nll[start:start + n].mean())))
            start += n
        return out

    def predict(self, inputs: Any, batch_size: int = 256) -> list[Any]:
        """``generate(inputs)`` with greedy search."""
        return self.generate(inputs)

    def scores(self, inputs: Any, batch_size: int = 256) -> np.ndarray:
        raise CheckpointError("a causal language model outputs text: use generate (or predict), or perplexity")

    def predict_proba(self, inputs: Any, batch_size: int = 256) -> np.ndarray:
        raise CheckpointError("a causal language model outputs text, not class probabilities: use generate")

    @property
    def labels(self) -> list[str] | None:
        return None

    def export_files(self, folder: Path) -> dict[str, Any] | None:
        """Copy the tokenizer files into the export ``folder`` (where this predictor finds them), and write a Hugging
        Face folder ``hf/`` (weights, config, tokenizer) and, for a LoRA model, its adapter ``adapter/``."""
        folder = Path(folder)
        if self.tokenizer_folder is not None:
            for name in TOKENIZER_FILES:
                if (self.tokenizer_folder / name).is_file():
                    shutil.copyfile(self.tokenizer_folder / name, folder / name)
        model = causal_lm_of(self.model)
        if model is not None:
            save_pretrained(model, folder / "hf")
            self.tokenizer.save_pretrained(str(folder / "hf"))
            if getattr(model, "peft_model", None) is not None:
                save_adapter(model, folder / "adapter")
        return None
