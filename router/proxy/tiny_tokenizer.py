"""Build ``kvroute-tiny``: the small word-level tokenizer the demo, tests and docker fleet use.

Why our own: nothing may download at test time, and a real model's tokenizer is tens of
MB. This one has the parts that matter for routing - special tokens, a BOS added by the
post-processor (like Llama's), a chat template in ``tokenizer_config.json`` - and a vocab
whose word ids cover the workloads' token range, so decode -> encode is the identity on
any id sequence in ``[FIRST_WORD, VOCAB)`` (``kvroute demo`` sends its workloads as text).

Regenerate with ``python -m router.proxy.tiny_tokenizer router/proxy/data/tiny``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

VOCAB = 8192
FIRST_WORD = 100
SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SPECIALS += ["<|end|>"]
PUNCT = [".", ",", "?", "!", ":", ";", "'", '"', "(", ")", "-"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' }} {{ m['content'] }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DEFAULT_DIR = Path(__file__).resolve().parent / "data" / "tiny"


def words() -> list[str]:
    """``VOCAB - FIRST_WORD`` distinct lower-case pseudo-words, deterministic."""
    consonants, vowels = "bdfghjklmnprstvwz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]  # 85
    out = [a + b for a, b in itertools.product(syllables, repeat=2)]  # 7225
    out += [a + b + c for a, b, c in itertools.product(syllables[:20], repeat=3)]
    return out[: VOCAB - FIRST_WORD]


def build(out_dir: Path = DEFAULT_DIR) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    vocab: dict[str, int] = {}
    for i, special in enumerate(SPECIALS + PUNCT):
        vocab[special] = i
    for i in range(len(vocab), FIRST_WORD):
        vocab[f"<|reserved_{i}|>"] = i
    for i, word in enumerate(words()):
        vocab[word] = FIRST_WORD + i
    assert len(vocab) == VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR)
