#!/usr/bin/env python
"""Writes a synthetic task as conversations (JSON Lines), and optionally a tiny random Qwen2 chat model to tune.

    python examples/make_chats.py --out data/chats --tiny_model models/tiny-qwen2
    mpirun -np 2 lmkit train --init_from models/tiny-qwen2 --train_file data/chats/train.jsonl \
        --valid_file data/chats/valid.jsonl --packing --model_dir runs/chats --set num_steps=64 \
        --set batch_size=16 --set learning_rate=3e-3 --set "schedule='constant'" --set dropout=0.0 \
        --warmup_steps 100 --max_steps 600
    lmkit generate --model_dir runs/chats --chat --strategy greedy --prompt "reverse: b e c"

Each record is one conversation in the OpenAI / Hugging Face chat format::

    {"messages": [{"role": "system", "content": "You reverse sequences."},
                  {"role": "user", "content": "reverse: b e c"},
                  {"role": "assistant", "content": "c e b"}]}

about a third with a system turn, a quarter with a second user and
assistant turn. The task (``lmkit.data.synthetic``: copy, reverse, sort; its symbols as letters) is
exact, so an answer is right or wrong; the sequences of ``valid.jsonl`` and
``heldout.jsonl`` never appear in ``train.jsonl``. ``heldout.jsonl`` holds
one question each (the answer the assistant must give, for checking).

``--tiny_model`` also writes a Hugging Face folder of a randomly
initialised Qwen2 (about a hundred thousand weights) with a byte-level BPE
tokenizer trained on the conversations and a ChatML chat template, as
transformers saves them (needs ``transformers`` and ``torch``): a model to
fine-tune in a minute on a CPU. With a real chat model instead
(``--init_from Qwen2.5-0.5B-Instruct``), the conversations train the same way.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.data.synthetic import TASKS, make_pairs  # noqa: E402  (no TensorFlow)

# ChatML, as Qwen2 lays a conversation out (without Qwen's default system turn: shorter examples).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def letters(text):
    """``s0 s3 s1`` as ``a d b``: one token a symbol for a byte-level BPE (which splits ``s3`` into ``s`` ``3``)."""
    return " ".join(chr(ord("a") + int(symbol[1:])) for symbol in text.split())


def conversations(task, pairs, seed):
    """A conversation for each ``(question, answer)`` text pair, some with a system turn, some two-turn."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(pairs):
        messages = [{"role": "system", "content": f"You {task} sequences."}] if rng.random() < 0.3 else []
        for question, answer in pairs[i:i + (2 if rng.random() < 0.25 else 1)]:
            messages += [{"role": "user", "content": f"{task}: {question}"},
                         {"role": "assistant", "content": answer}]
            i += 1
        out.append({"messages": messages})
    return out


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def write_chats(out, task="reverse", train=2000, valid=200, heldout=100, seed=0, **sizes):
    """Writes ``train.jsonl``, ``valid.jsonl`` and ``heldout.jsonl`` into ``out``; returns their paths."""
    os.makedirs(out, exist_ok=True)
    seen, paths = [], {}
    for k, (split, count) in enumerate((("train", train), ("valid", valid), ("heldout", heldout))):
        pairs = make_pairs(task, count, seed=seed * 3 + k, exclude=seen, **sizes)
        seen += [question for question, _ in pairs]
        pairs = [(letters(question), letters(answer)) for question, answer in pairs]
        paths[split] = os.path.join(out, f"{split}.jsonl")
        if split == "heldout":  # one question each, and the answer it must get
            write_jsonl(paths[split], [{"messages": [{"role": "user", "content": f"{task}: {q}"}], "answer": a}
                                       for q, a in pairs])
        else:
            write_jsonl(paths[split], conversations(task, pairs, seed * 7 + k))
    return paths


def write_tiny_qwen2(folder, train_file, hidden_size=64, layers=2, seed=0, max_positions=256):
    """A random Qwen2 with a BPE tokenizer trained on ``train_file``'s conversations and a ChatML template."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    with open(train_file, encoding="utf-8") as f:
        texts = [m["content"] for line in f for m in json.loads(line)["messages"]]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts + ["system", "user", "assistant"], vocab_size=400, min_frequency=1,
                            special_tokens=SPECIAL)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=None, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    os.makedirs(folder, exist_ok=True)
    tokenizer.save_pretrained(folder)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True, eos_token_id=end,
                         bos_token_id=None, pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=end, do_sample=False)
    model.save_pretrained(folder)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", choices=sorted(TASKS), default="reverse")
    p.add_argument("--out", required=True, help="the folder for train.jsonl, valid.jsonl and heldout.jsonl")
    p.add_argument("--train", type=int, default=2000, help="training questions (conversations hold 1 or 2)")
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--heldout", type=int, default=100)
    p.add_argument("--symbols", type=int, default=10, help="distinct symbols (a, b, ...; at most 26)")
    p.add_argument("--min_length", type=int, default=2)
    p.add_argument("--max_length", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny_model", default=None, metavar="DIR",
                   help="also write a tiny random Qwen2 chat model there (needs transformers and torch)")
    p.add_argument("--hidden_size", type=int, default=64, help="--tiny_model's width")
    args = p.parse_args()
    paths = write_chats(args.out, args.task, args.train, args.valid, args.heldout, args.seed, symbols=args.symbols,
                        min_length=args.min_length, max_length=args.max_length)
    print(f"{args.task}: {args.train} training, {args.valid} validation and {args.heldout} held-out questions in "
          f"{', '.join(paths.values())}")
    if args.tiny_model:
        write_tiny_qwen2(args.tiny_model, paths["train"], args.hidden_size, seed=args.seed)
        print(f"a tiny random Qwen2 chat model in {args.tiny_model}")


if __name__ == "__main__":
    main()
