"""A tokenizer's chat template applied to ``sft`` records, as ``transformers`` applies it.

A Hugging Face tokenizer folder may carry a chat template (``tokenizer_config.json``'s
``chat_template``, or a ``chat_template.jinja`` file beside it): how the model was tuned to read a
conversation. An instruction-tuned model retrained on raw ``prompt`` + ``response`` text would
forget it, so staging renders each record as the one-turn conversation the template makes of it
(``transformers``' ``apply_chat_template``: a sandboxed Jinja environment with ``trim_blocks``
and ``lstrip_blocks``, ``raise_exception``, the tokenizer's special tokens as variables):

- the prompt is the conversation up to the assistant's turn (``add_generation_prompt=True``);
- the response is what the full conversation adds after it (the answer and the template's end of
  turn), so the loss still falls on the response only.

A template whose full conversation does not begin with its prompt cannot be split this way and
is refused, naming the tokenizer. Pure apart from :func:`read_chat_template`'s reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trainer.contract import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, chat_template_text
from trainops.staging.errors import StagingError

# The special tokens transformers passes to a template as variables, when the tokenizer has them.
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it may use; ``source`` names it in messages."""

    template: str
    source: str
    special: Mapping[str, str] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """What the dataset version counts: the template's text."""
        return hashlib.sha256(self.template.encode()).hexdigest()

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        def raise_exception(message: str):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, indent=indent, ensure_ascii=False
        )
        try:
            return env.from_string(self.template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special
            )
        except TemplateError as exc:
            raise StagingError(f"the chat template of {self.source} failed on a record: {exc}") from None

    def split(self, prompt: str, response: str) -> tuple[str, str]:
        """``(prompt text, response text)`` of the one-turn conversation ``prompt`` -> ``response``."""
        user = [{"role": "user", "content": prompt}]
        asked = self.render(user, add_generation_prompt=True)
        full = self.render([*user, {"role": "assistant", "content": response}], add_generation_prompt=False)
        if not full.startswith(asked):
            raise StagingError(
                f"the chat template of {self.source} renders a conversation that does not begin with its "
                f"prompt ({asked[-40:]!r} is not where {full[len(asked) - 40 : len(asked)]!r} is), so staging "
                "cannot tell the response's tokens from the prompt's: stage with a tokenizer.json in a folder "
                "without this template"
            )
        return asked, full[len(asked) :]


def _text(value: Any) -> str | None:
    """A special token's text: a string, or an added token's ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def read_chat_template(tokenizer_uri: str, read: Callable[[str], bytes | None]) -> ChatTemplate | None:
    """The chat template beside the ``tokenizer.json`` at ``tokenizer_uri`` (``chat_template.jinja``,
    else ``tokenizer_config.json``'s ``chat_template``: :func:`trainer.contract.chat_template_text`),
    with that config's special tokens; None when it has none. ``read(uri)`` returns a file's
    bytes, None when there is none."""
    folder = tokenizer_uri.rsplit("/", 1)[0]
    raw = read(f"{folder}/{TOKENIZER_CONFIG_FILE}")
    try:
        config = json.loads(raw) if raw is not None else {}
    except ValueError:
        raise StagingError(f"{folder}/{TOKENIZER_CONFIG_FILE} is not JSON: fix or remove it") from None
    special = {key: text for key in SPECIAL_TOKEN_KEYS if (text := _text(config.get(key))) is not None}
    jinja = read(f"{folder}/{CHAT_TEMPLATE_FILE}")
    template = chat_template_text(config, jinja)
    if template is None:
        return None
    source = f"{folder}/{CHAT_TEMPLATE_FILE if jinja is not None else TOKENIZER_CONFIG_FILE}"
    return ChatTemplate(template, source, special)
