"""The cases of `bench/gpu_check.py`, per device: GPU sizes, and small ones a CPU runs in seconds.

GPU (issue 37): ``hf:gpt2`` and a two-layer Llama-3-8B-shaped model in bf16 at 1,024 and 4,096
tokens, batch 1 and 8, and the zoo's conv net (fp32) through ``analyze validate``; the
inference peak and one AMP-bf16 AdamW step of both; a decode step of the whole Llama-3-8B
(32 layers) at batch 1 and 32 against 4,096 cached tokens.
CPU: the same architectures shrunk (two layers, width 128-256, vocab 2,048) so the whole check
runs in about a minute and CI proves the script works.
"""

from __future__ import annotations

from .measure import Case

LLAMA2L = {"num_hidden_layers": 2}
TINY_LLAMA = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048}
TINY_GPT2 = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 2048}


def gpu_cases() -> dict[str, list[Case]]:
    llama = [Case(f"llama3-8b-L2 b{b} T{t}", "llama-3-8b", b, t, overrides=LLAMA2L)
             for t in (1024, 4096) for b in (1, 8)]
    gpt2 = [Case("gpt2 b1 T1024", "gpt2", 1, 1024),
            Case("gpt2 b8 T1024", "gpt2", 8, 1024),
            Case("gpt2 b8 T4096", "gpt2", 8, 4096, overrides={"n_positions": 4096})]
    convnet = Case("convnet w64 b64 224²", "zoo:convnet", 64, 224, "float32",
                   overrides={"width": 64})
    return {
        "validate": [gpt2[0], llama[0], convnet, gpt2[1], llama[1], llama[2], gpt2[2], llama[3]],
        "forward": [gpt2[0], llama[0], gpt2[1], llama[2], gpt2[2], llama[3]],
        "train": [Case("gpt2 b8 T1024", "gpt2", 8, 1024, "float32"),
                  Case("llama3-8b-L2 b1 T4096", "llama-3-8b", 1, 4096, "float32", LLAMA2L)],
        "decode": [Case(f"llama3-8b b{b} C4096", "llama-3-8b", b, 1, context=4096)
                   for b in (1, 32)],
    }


def cpu_cases() -> dict[str, list[Case]]:
    llama = [Case(f"tiny-llama b{b} T{t}", "llama-3-8b", b, t, "float32", TINY_LLAMA)
             for t, b in ((128, 1), (256, 2))]
    gpt2 = Case("tiny-gpt2 b2 T128", "gpt2", 2, 128, "float32", TINY_GPT2)
    convnet = Case("convnet w16 b2 32²", "zoo:convnet", 2, 32, "float32")
    return {
        "validate": [gpt2, llama[0], convnet],
        "forward": [gpt2, llama[1]],
        "train": [gpt2, llama[0]],
        "decode": [Case(f"tiny-llama b{b} C256", "llama-3-8b", b, 1, "float32", TINY_LLAMA,
                        context=256) for b in (1, 4)],
    }
