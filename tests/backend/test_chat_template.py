"""Chat templates render like transformers' and stay inside Jinja's sandbox."""

from __future__ import annotations

import pytest

from tokenedge_wire.chat_template import ChatTemplate, ChatTemplateError

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chatml_with_and_without_generation_prompt() -> None:
    template = ChatTemplate(CHATML)
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(messages, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_bos_token_and_tojson_are_available() -> None:
    template = ChatTemplate("{{ bos_token }}{{ messages[0] | tojson }}", bos_token="<s>")
    assert template.render([{"role": "user", "content": "é"}]) == '<s>{"role": "user", "content": "é"}'


def test_raise_exception_becomes_a_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="user first"):
        template.render([{"role": "assistant", "content": "x"}])


def test_sandbox_blocks_attribute_escapes() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])


def test_immutable_sandbox_refuses_mutation() -> None:
    template = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])
