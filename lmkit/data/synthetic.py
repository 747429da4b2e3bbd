"""Synthetic transduction tasks: line-aligned source/target files whose answer is known.

    from lmkit.data.synthetic import write_task
    files = write_task("data/reverse", "reverse", train=20000, valid=500, test=500)
    # lmkit train --config config_seq2seq --source_file data/reverse/train.src --target_file ...

Each task maps a sequence of symbols (``s0`` .. ``s<V-1>``, separated by
spaces, so the word tokenizer reads one symbol a token) to another, exactly:

* ``copy``: the sequence itself;
* ``reverse``: the sequence backwards;
* ``sort``: the symbols in ascending order of their number.

Sequences have ``min_length`` .. ``max_length`` symbols, drawn uniformly from
``seed``; the test and validation sequences are drawn apart from the
training ones and never equal one of them (held out). Adding a task is one
function and one line in :data:`TASKS`.
"""

from __future__ import annotations

import os
import random
from typing import Callable, Dict, List, Sequence

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError

__all__ = ["TASKS", "make_pairs", "write_task"]


def _sort(symbols: Sequence[int]) -> List[int]:
    return sorted(symbols)


#: task name -> the exact target of a source (a list of symbol numbers).
TASKS: Dict[str, Callable[[Sequence[int]], List[int]]] = {
    "copy": list,
    "reverse": lambda symbols: list(reversed(symbols)),
    "sort": _sort,
}


def _text(symbols: Sequence[int]) -> str:
    return " ".join(f"s{n}" for n in symbols)


def make_pairs(task: str, count: int, *, symbols: int = 20, min_length: int = 3, max_length: int = 12,
               seed: int = 0, exclude: Sequence[str] = ()) -> List[tuple]:
    """``count`` distinct ``(source, target)`` text pairs of ``task``, none with a source in ``exclude``.

    Raises:
      UsageError: an unknown task or bad sizes (or too few distinct sequences for ``count``).
    """
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; {did_you_mean(task, sorted(TASKS), listing='tasks')}")
    for name, value in (("count", count), ("symbols", symbols), ("min_length", min_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} = {value!r} must be a positive integer")
    if max_length < min_length:
        raise UsageError(f"max_length {max_length} is below min_length {min_length}")
    possible = sum(symbols ** n for n in range(min_length, max_length + 1))
    if count > possible // 2:
        raise UsageError(f"{count} distinct sequences of {min_length}-{max_length} of {symbols} symbols are too "
                         "many to draw; ask for fewer, or for more symbols or longer sequences")
    rng, seen, pairs = random.Random(seed), set(exclude), []
    while len(pairs) < count:
        source = [rng.randrange(symbols) for _ in range(rng.randint(min_length, max_length))]
        text = _text(source)
        if text in seen:
            continue
        seen.add(text)
        pairs.append((text, _text(TASKS[task](source))))
    return pairs


def write_task(folder: str, task: str, *, train: int = 20000, valid: int = 500, test: int = 500,
               symbols: int = 20, min_length: int = 3, max_length: int = 12, seed: int = 0) -> Dict[str, str]:
    """Writes ``{train,valid,test}.{src,tgt}`` of ``task`` into ``folder``; returns the paths by name.

    The validation and test sources differ from every training source (and from each other).
    """
    options = dict(symbols=symbols, min_length=min_length, max_length=max_length)
    os.makedirs(folder, exist_ok=True)
    paths: Dict[str, str] = {}
    seen: List[str] = []
    for k, (split, count) in enumerate((("train", train), ("valid", valid), ("test", test))):
        pairs = make_pairs(task, count, seed=seed * 3 + k, exclude=seen, **options)
        seen += [source for source, _ in pairs]
        for side, column in (("src", 0), ("tgt", 1)):
            path = os.path.join(folder, f"{split}.{side}")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(pair[column] + "\n" for pair in pairs))
            paths[f"{split}_{side}"] = path
    return paths
