"""What a generation runs on, decided once: a run folder or a Hugging Face folder, a language model or an
encoder-decoder.

    from lmkit.decoding.source import load_generator, open_folder
    folder = open_folder("runs/reverse")        # no TensorFlow: the kind, the tokenizers, the folder's config
    folder.conditional, folder.hugging_face     # (True, False): an encoder-decoder's training run
    generator = folder.load()                   # the model, its tokenizers, the folder's GenerationConfig

:func:`open_folder` looks at a folder without building anything (the
commands check their flags against it before TensorFlow starts);
:meth:`ModelFolder.load` and :func:`load_generator` build the model.
``lmkit generate``, ``lmkit evaluate`` and :func:`lmkit.decoding.generate`
all go through here, so the questions "run or Hugging Face folder, language
model or encoder-decoder, which ``generation_config.json``" have one answer.

It relies on the hub for Hugging Face folders (:func:`lmkit.hub.folders.is_hf_folder`,
:func:`lmkit.hub.converters.converter_of` and ``check_pretrained``,
:func:`lmkit.hub.tokenizer.read_tokenizer`) and on :func:`lmkit.models.build.load_pretrained` and
:func:`lmkit.train.checkpoint.load_model` to build models.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig

__all__ = ["Generator", "ModelFolder", "is_seq2seq_run", "load_generator", "open_folder",
           "source_tokenizer_of_run"]


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """A model folder, looked at without TensorFlow.

    Attributes:
      path: the folder.
      hugging_face: a Hugging Face folder (``config.json`` with a ``model_type``); else an lmkit run.
      conditional: it holds an encoder-decoder (a run trained on pairs, a Hugging Face encoder-decoder's folder).
    """

    path: str
    hugging_face: bool
    conditional: bool

    def check_checkpoint(self, checkpoint: Optional[str]) -> None:
        """UsageError for a checkpoint asked of a Hugging Face folder (it has one set of weights)."""
        if checkpoint and self.hugging_face:
            raise UsageError(f"--checkpoint applies to lmkit training runs; {self.path} is a Hugging Face "
                             "folder with one set of weights")

    def tokenizer(self, checkpoint: Optional[str] = None) -> Any:
        """The (target side's) tokenizer, the folder checked first; no TensorFlow needed.

        Raises:
          UsageError: a ``checkpoint`` asked of a Hugging Face folder, a folder lmkit cannot read
            (naming the file and the key), a run without its tokenizer.
        """
        if self.hugging_face:
            from lmkit.hub.converters import check_pretrained
            from lmkit.hub.tokenizer import read_tokenizer
            self.check_checkpoint(checkpoint)
            check_pretrained(self.path)
            return read_tokenizer(self.path)
        from lmkit.data.tokenizers import tokenizer_of_run
        return tokenizer_of_run(self.path)

    def pretrained_source(self) -> Optional[str]:
        """The Hugging Face folder behind this one: itself, or the folder a run was fine-tuned from
        (``init_from``) while it is there; None for a run trained from scratch."""
        if self.hugging_face:
            return self.path
        from lmkit.config import stored_setting
        from lmkit.core.layout import read_config_dict
        from lmkit.hub.folders import is_hf_folder
        try:
            source = stored_setting(read_config_dict(self.path), "init_from")
        except (UsageError, OSError, ValueError):
            return None
        return source if isinstance(source, str) and is_hf_folder(source) else None

    def generation_config(self) -> Tuple[GenerationConfig, Optional[str]]:
        """``(config, folder)``: how the folder's ``generation_config.json`` asks to generate
        (:meth:`GenerationConfig.from_hf`; a run's, that of the folder it was fine-tuned from), and the
        folder that gave it; ``(GenerationConfig(), None)`` where none does: lmkit's defaults."""
        source = self.pretrained_source()
        return (GenerationConfig(), None) if source is None else (GenerationConfig.from_hf(source), source)

    def trained_context(self) -> Optional[int]:
        """The window length a run trained its model on (``num_steps``), or None when any position will do.

        A transformer learns its position embeddings only where training put
        tokens: a run with ``num_steps`` 64 and ``max_positions`` 128 never
        trained positions 64-127, so generation slides at 64. Pretrained models
        (Hugging Face folders, runs with ``init_from``) keep their
        ``max_positions``.
        """
        if self.hugging_face:
            return None
        from lmkit.config import stored_setting
        from lmkit.core.layout import read_config_dict
        config = read_config_dict(self.path)
        if stored_setting(config, "init_from"):
            return None
        steps = stored_setting(config, "num_steps")
        return int(steps) if isinstance(steps, int) and steps > 0 else None

    def load(self, checkpoint: Optional[str] = None, tokenizer: Any = None) -> "Generator":
        """The model with its tokenizers and the folder's generation config.

        Args:
          checkpoint: a run's ``ckpt-<step>`` folder (default the newest that reads back).
          tokenizer: a Hugging Face folder's tokenizer when the caller has read it already.

        Raises:
          UsageError: what :meth:`tokenizer` or :func:`lmkit.train.checkpoint.load_model` raise.
        """
        if self.hugging_face:
            from lmkit.models.build import load_pretrained
            self.check_checkpoint(checkpoint)
            model, tokenizer, hf_config = load_pretrained(self.path, tokenizer)  # reads the tokenizer when None
            source = tokenizer.source_side() if self.conditional else None  # its sources end with the end token
            config, description = None, f"{hf_config['model_type']} (Hugging Face folder)"
        else:
            from lmkit.core.layout import resolve_checkpoint
            from lmkit.train.checkpoint import load_model
            model, tokenizer, config = load_model(self.path, resolve_checkpoint(self.path, checkpoint))
            source = source_tokenizer_of_run(self.path, config.data.share_vocab) if self.conditional else None
            description = config.model.name
        return Generator(model, tokenizer, source, config=config, folder=self, description=description)


def open_folder(path: Any) -> ModelFolder:
    """The :class:`ModelFolder` at ``path`` (no TensorFlow; a missing folder is an lmkit run that
    :meth:`ModelFolder.load` names)."""
    path = os.fspath(path)
    from lmkit.hub.folders import is_hf_folder
    hugging_face = is_hf_folder(path)
    return ModelFolder(path, hugging_face, _holds_encoder_decoder(path, hugging_face))


def _holds_encoder_decoder(path: str, hugging_face: bool) -> bool:
    if hugging_face:
        from lmkit.hub.converters import converter_of
        try:
            return bool(converter_of(path).conditional)
        except UsageError:  # a family lmkit does not read: loading it says so
            return False
    from lmkit.config import stored_setting
    from lmkit.core.layout import CONFIG_FILE, read_config_dict
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return False
    return stored_setting(read_config_dict(path), "data") == "pairs"


def is_seq2seq_run(model_dir: str) -> bool:
    """Whether ``model_dir`` holds an encoder-decoder: a run whose config.json says data = "pairs", or a
    Hugging Face folder of an encoder-decoder family."""
    return open_folder(model_dir).conditional


def source_tokenizer_of_run(model_dir: str, share_vocab: bool) -> Any:
    """The source side's tokenizer: the run's own one, or the one in ``<model_dir>/source_tokenizer``."""
    from lmkit.core.layout import SOURCE_TOKENIZER_DIR
    from lmkit.data.tokenizers import load_tokenizer, tokenizer_of_run
    if share_vocab:  # the same ids; a pretrained folder's may end sources with its end token
        return tokenizer_of_run(model_dir).source_side()
    return load_tokenizer(os.path.join(model_dir, SOURCE_TOKENIZER_DIR))


@dataclasses.dataclass(frozen=True)
class Generator:
    """A model ready to generate, with what it reads and writes.

    Attributes:
      model: a language model or an encoder-decoder (``model.conditional``).
      tokenizer: the tokenizer of what it writes (an encoder-decoder's target side).
      source_tokenizer: an encoder-decoder's source side (None for a language model).
      config: a run's :class:`lmkit.config.TrainConfig` (None otherwise).
      folder: the :class:`ModelFolder` it came from (None for a model object).
      description: the model's name, for logs.
    """

    model: Any
    tokenizer: Any
    source_tokenizer: Any = None
    config: Any = None
    folder: Optional[ModelFolder] = None
    description: str = ""

    @property
    def conditional(self) -> bool:
        """Whether the model is an encoder-decoder (it decodes sources)."""
        return bool(getattr(self.model, "conditional", False))

    @property
    def preset(self) -> GenerationConfig:
        """What its folder's ``generation_config.json`` asks for (:meth:`ModelFolder.generation_config`;
        read when asked, so a generation that needs none does not read it)."""
        return GenerationConfig() if self.folder is None else self.folder.generation_config()[0]

    @property
    def preset_source(self) -> Optional[str]:
        """The folder whose ``generation_config.json`` gives :attr:`preset` (None: lmkit's defaults)."""
        return None if self.folder is None else self.folder.generation_config()[1]

    def trained_context(self) -> Optional[int]:
        """:meth:`ModelFolder.trained_context` of its run (None for any other model)."""
        return None if self.folder is None else self.folder.trained_context()


def load_generator(source: Any, *, checkpoint: Optional[str] = None, tokenizer: Any = None) -> Generator:
    """The :class:`Generator` of ``source``.

    Args:
      source: a model folder (an lmkit run or a Hugging Face folder), a :class:`ModelFolder`, a
        :class:`Generator` (an encoder-decoder's: ``Generator(model, tokenizer, source_tokenizer)``), a
        ``(model, tokenizer)`` pair, or a language model object (then pass ``tokenizer``).
      checkpoint: a run's ``ckpt-<step>`` folder (default the newest).
      tokenizer: the tokenizer of a model object.

    Raises:
      UsageError: a tokenizer given with a folder, a model object without one, or what loading raises.
    """
    if isinstance(source, (str, os.PathLike, ModelFolder)):
        if tokenizer is not None:
            raise UsageError("tokenizer= is for a model object; a model folder brings its own")
        folder = source if isinstance(source, ModelFolder) else open_folder(source)
        return folder.load(checkpoint)
    if checkpoint is not None:
        raise UsageError("checkpoint= is for a training run's folder, not a model object")
    if isinstance(source, Generator):
        return source
    if isinstance(source, tuple) and len(source) == 2 and tokenizer is None:
        source, tokenizer = source
    if tokenizer is None:
        raise UsageError("generate(model_object, ...) needs tokenizer=; or pass a model folder")
    if getattr(source, "conditional", False):
        raise UsageError("an encoder-decoder needs its source tokenizer as well: pass "
                         "Generator(model, tokenizer, source_tokenizer) or a model folder")
    return Generator(source, tokenizer)
