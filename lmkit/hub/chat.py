"""Chat templates: a Hugging Face folder's Jinja template turns messages into the prompt text and its ids.

    from lmkit.hub.chat import encode_chat, render_chat
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = render_chat(messages, "models/qwen2.5-0.5b-instruct")            # the prompt, as text
    ids = encode_chat(tokenizer, messages, "models/qwen2.5-0.5b-instruct")  # and as the model reads it

Chat models are trained on conversations laid out by one template each
(``<|im_start|>user ...<|im_end|>`` for Qwen, ``<|start_header_id|>`` for
Llama 3). The template is Jinja, stored in ``chat_template.jinja``
(transformers 5) or as ``chat_template`` in ``tokenizer_config.json``
(earlier versions; a string, or a list of named templates). It is rendered
with Jinja2's sandbox, as transformers does, with ``messages``,
``add_generation_prompt`` and the folder's special tokens (``bos_token``,
``eos_token``, ...) as variables, ``raise_exception`` and ``strftime_now``
as functions and ``tojson`` as a filter. transformers' ``{% generation %}`` ...
``{% endgeneration %}`` markers (around an assistant's tokens, for its assistant
masks) render as their content.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from lmkit.core.errors import UsageError

__all__ = ["ChatTemplate", "Messages", "check_messages", "encode_chat", "read_chat_template", "render_chat"]

#: A conversation: ``[{"role": "system" | "user" | "assistant", "content": text}, ...]``.
Messages = Sequence[Mapping[str, str]]

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: Any) -> Optional[str]:
    """A special token of tokenizer_config.json: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _generation_tag() -> type:
    """A Jinja extension that reads ``{% generation %}`` ... ``{% endgeneration %}`` as its body alone
    (a scope of its own, as transformers' tracker renders it)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Generation


class ChatTemplate:
    """A folder's chat template and special tokens.

    Args:
      source: the template's Jinja text.
      special_tokens: ``bos_token``, ``eos_token``... -> their text.
      where: the file it came from (for messages).
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str], where: str) -> None:
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise UsageError("chat templates are rendered with jinja2, which is not installed; "
                             "pip install 'lmkit[hf]' (or pip install jinja2)") from None

        def raise_exception(message: str) -> None:
            raise UsageError(f"{where}: the chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols", _generation_tag()])
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise UsageError(f"{where}: the chat template is not valid Jinja ({exc})") from None
        self.special_tokens = dict(special_tokens)
        self.where = where

    @property
    def eos_token(self) -> Optional[str]:
        """The end-of-turn text the template closes a message with (its ``eos_token``)."""
        return self.special_tokens.get("eos_token")

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (each ``{"role": ..., "content": ...}``).

        Raises:
          UsageError: the template raised (e.g. roles out of order) or failed.
        """
        import jinja2
        try:
            return self.template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                        **self.special_tokens)
        except jinja2.TemplateError as exc:
            raise UsageError(f"{self.where}: the chat template failed on these messages ({exc})") from None

    @staticmethod
    def messages(prompt: str, system: Optional[str] = None) -> List[Dict[str, str]]:
        """One user turn (after a system turn when ``system`` is given)."""
        out = [{"role": "system", "content": system}] if system else []
        return out + [{"role": "user", "content": prompt}]


def read_chat_template(folder: str, fix: str = "--chat needs a chat model's folder, or leave --chat out",
                       template_file: Optional[str] = None) -> ChatTemplate:
    """The chat template of a Hugging Face folder, or of ``template_file`` with the folder's special tokens
    (``--chat_template FILE``); ``fix``: what the message about a folder without one says to do.

    Raises:
      UsageError: the folder has none (naming the files looked at), or it is broken.
    """
    config_path = os.path.join(folder, TOKENIZER_CONFIG)
    config: Dict[str, Any] = {}
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{config_path} is not readable JSON ({exc})") from None
    special = {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}
    path = template_file or os.path.join(folder, TEMPLATE_FILE)
    if template_file is not None and not os.path.isfile(template_file):
        raise UsageError(f"the chat template file {template_file!r} does not exist; give a Jinja file")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return ChatTemplate(f.read(), special, path)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return ChatTemplate(template, special, config_path)
    raise UsageError(f"{folder} has no chat template (neither {TEMPLATE_FILE} nor chat_template in "
                     f"{TOKENIZER_CONFIG}); {fix}")


def _template(template: Union[ChatTemplate, str, "os.PathLike[str]"]) -> ChatTemplate:
    return template if isinstance(template, ChatTemplate) else read_chat_template(os.fspath(template))


def check_messages(messages: Any) -> List[Dict[str, str]]:
    """``messages`` as a list of ``{"role", "content"}`` dicts of text.

    Raises:
      UsageError: naming the first message that is not one.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise UsageError(f"messages = {messages!r} must be a non-empty list of {{'role': ..., 'content': ...}} dicts")
    for number, message in enumerate(messages):
        if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise UsageError(f"message {number} = {message!r} must be a dict with a 'role' and a 'content' text, "
                             "e.g. {'role': 'user', 'content': 'Hi'}")
    return [dict(message) for message in messages]


def render_chat(messages: Messages, template: Union[ChatTemplate, str, "os.PathLike[str]"],
                add_generation_prompt: bool = True) -> str:
    """The text of a conversation as ``template`` lays it out (``transformers``' ``apply_chat_template``).

    Args:
      messages: ``[{"role": ..., "content": ...}, ...]``.
      template: a :class:`ChatTemplate`, or a Hugging Face folder holding one (:func:`read_chat_template`).
      add_generation_prompt: end with the opening of the assistant's turn (to generate it).

    Raises:
      UsageError: a malformed message, a folder without a template, or the template refusing the messages.
    """
    return _template(template).render(check_messages(messages), add_generation_prompt)


def encode_chat(tokenizer: Any, messages: Messages, template: Union[ChatTemplate, str, "os.PathLike[str]"],
                add_generation_prompt: bool = True) -> List[int]:
    """The token ids of :func:`render_chat`'s text, encoded whole, the template's special tokens read as tokens:
    ``apply_chat_template(..., tokenize=True)``'s ids.

    Args:
      tokenizer: a Hugging Face tokenizer (:class:`lmkit.hub.tokenizer.HFTokenizer`, as a chat model's folder
        or a run fine-tuned from one has).

    Raises:
      UsageError: what :func:`render_chat` raises, or a tokenizer of lmkit's own (it has no special tokens).
    """
    text = render_chat(messages, template, add_generation_prompt)
    hf = getattr(tokenizer, "hf", None)
    if hf is None:
        raise UsageError(f"a chat template's text is encoded by its model's Hugging Face tokenizer, not by a "
                         f"{getattr(tokenizer, 'name', type(tokenizer).__name__)} tokenizer; use a chat model's "
                         "folder or a run fine-tuned from one")
    return list(hf.encode(text, add_special_tokens=False).ids)
