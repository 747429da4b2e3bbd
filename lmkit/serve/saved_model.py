"""A SavedModel whose ``serving_default`` runs the whole decode loop, key/value cache included, in one graph.

    lmkit export --model_dir runs/plays --format saved_model --output plays_savedmodel

    loaded = tf.saved_model.load("plays_savedmodel")          # no lmkit needed
    out = loaded.signatures["serving_default"](ids=..., lengths=..., max_new_tokens=..., temperature=..., seed=...)
    out["new_ids"], out["new_lengths"]

The signature takes ``ids`` (int32 [batch, time], each row a prompt as the
model reads it, padded on the right: ``lmkit.json`` beside the model gives the
start id to put first), ``lengths`` (int32 [batch]), ``max_new_tokens``
(int32), ``temperature`` (float32; 0 greedy, else sampling from the whole
distribution of ``logits / temperature``) and ``seed`` (int64). It returns
``new_ids`` (int32 [batch, max_new_tokens], the end id after a row's end)
and ``new_lengths`` (int32 [batch], tokens before the end). One
``tf.while_loop`` feeds one token a step through ``model.step`` (the prompt's
tokens forced, as lmkit's decode loop does), compiled with XLA; greedy output
is ``lmkit generate --strategy greedy``'s, sampled output ``lmkit generate
--strategy sample --temperature T --seed S``'s (the samplers' own draw).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Sequence

import tensorflow as tf

from lmkit.decoding.samplers import GreedySampler, RandomSampler

__all__ = ["DecodeModule", "export_saved_model"]

SIGNATURE = [tf.TensorSpec([None, None], tf.int32, name="ids"), tf.TensorSpec([None], tf.int32, name="lengths"),
             tf.TensorSpec([], tf.int32, name="max_new_tokens"), tf.TensorSpec([], tf.float32, name="temperature"),
             tf.TensorSpec([], tf.int64, name="seed")]


class DecodeModule(tf.Module):
    """A language model with its decode loop, for ``tf.saved_model.save``.

    Args:
      model: a language model (docs/design.md's protocol: ``initial_state``, ``step``).
      length: positions of the cache: a prompt and its new tokens together.
      end_ids: ids that end a row (none: every row runs to ``max_new_tokens``).
      vocab_limit: ids at and past it are never chosen (a vocabulary padded past its tokenizer's).
    """

    def __init__(self, model: Any, length: int, end_ids: Sequence[int] = (), vocab_limit: Any = None) -> None:
        super().__init__(name="lmkit_decode")
        self.model, self.length, self.end_ids = model, int(length), tuple(int(i) for i in end_ids)
        self.vocab_limit = vocab_limit if vocab_limit and vocab_limit < int(model.vocab_size) else None
        self.serve = tf.function(self._decode, input_signature=SIGNATURE, jit_compile=True, autograph=False)

    def _decode(self, ids: tf.Tensor, lengths: tf.Tensor, max_new_tokens: tf.Tensor, temperature: tf.Tensor,
                seed: tf.Tensor) -> Dict[str, tf.Tensor]:
        batch, length = tf.shape(ids)[0], self.length
        buffer = tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]])  # [batch, length]
        end = tf.minimum(tf.reduce_max(lengths) + max_new_tokens, length)  # positions the loop fills
        positions = tf.range(length)
        ends = tf.constant(self.end_ids or (-1,), tf.int32)

        def body(t, buffer, state, finished):
            logits, state = self.model.step(buffer[:, t], state)  # [batch, vocab]: position t + 1's
            logits = tf.cast(logits, tf.float32)
            if self.vocab_limit is not None:
                logits = tf.where(tf.range(tf.shape(logits)[-1]) >= self.vocab_limit, -float("inf"), logits)
            pos = t + 1
            step_seed = tf.stack([seed, tf.cast(pos, tf.int64)])
            sampled = RandomSampler(1.0).get_next_token(logits / tf.maximum(temperature, 1e-30), pos, step_seed)
            token = tf.where(temperature > 0, sampled, GreedySampler().get_next_token(logits, pos, step_seed))
            in_prompt = pos < lengths  # [batch]
            token = tf.where(in_prompt, buffer[:, pos], tf.where(finished, ends[0], token))
            is_end = tf.reduce_any(tf.equal(token[:, tf.newaxis], ends[tf.newaxis, :]), axis=-1)
            finished = tf.logical_or(finished, tf.logical_and(tf.logical_not(in_prompt), is_end))
            buffer = tf.where(tf.equal(positions, pos)[tf.newaxis, :], token[:, tf.newaxis], buffer)
            return t + 1, buffer, state, finished

        def going(t, buffer, state, finished):
            return tf.logical_and(t < end - 1, tf.logical_not(tf.reduce_all(finished)))

        state = self.model.initial_state(batch, length)
        _, buffer, _, _ = tf.while_loop(going, body, (tf.constant(0), buffer, state, tf.zeros([batch], tf.bool)))
        index = tf.minimum(lengths[:, tf.newaxis] + tf.range(max_new_tokens)[tf.newaxis, :], length - 1)
        new_ids = tf.gather(buffer, index, batch_dims=1)  # [batch, max_new_tokens]
        inside = index < end  # positions the loop wrote (the rest, past the context, are the end id)
        is_end = tf.logical_or(tf.reduce_any(tf.equal(new_ids[:, :, tf.newaxis], ends), axis=-1),
                               tf.logical_not(inside))
        new_ids = tf.where(inside, new_ids, ends[0])
        new_lengths = tf.reduce_sum(tf.cast(tf.cumsum(tf.cast(is_end, tf.int32), axis=1) == 0, tf.int32), axis=1)
        return {"new_ids": new_ids, "new_lengths": new_lengths}


def export_saved_model(model_dir: str, output: str, checkpoint: Any = None) -> Dict[str, Any]:
    """Writes ``output``: the SavedModel of ``model_dir`` (an lmkit run or a Hugging Face folder of a language
    model) and ``lmkit.json`` (its start id, end ids and context).

    Returns:
      What ``lmkit.json`` holds.

    Raises:
      UsageError: an encoder-decoder, or what loading the folder raises.
    """
    from lmkit.core.errors import UsageError
    from lmkit.decoding.source import open_folder
    from lmkit.serve.text import Prompts
    folder = open_folder(model_dir)
    if folder.conditional:
        raise UsageError(f"{model_dir} holds an encoder-decoder; --format saved_model exports language models")
    generator = folder.load(checkpoint)
    prompts = Prompts(generator.tokenizer)
    window = int(getattr(generator.model, "max_positions", 0) or 0) or None
    length = generator.trained_context() or window or 1024
    module = DecodeModule(generator.model, length, prompts.end_ids, prompts.vocab_limit)
    tf.saved_model.save(module, output, signatures={"serving_default": module.serve.get_concrete_function()})
    info = {"start_id": prompts.start_id, "end_ids": prompts.end_ids, "context": length,
            "signature": {"inputs": [s.name for s in SIGNATURE], "outputs": ["new_ids", "new_lengths"]}}
    with open(os.path.join(output, "lmkit.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    return info
