"""A tool-calling chat template for a model whose own template TRL can't parse tool calls from, or mask for SFT.

TRL 1.15 parses tool calls only for templates it knows by exact string, and masks the assistant's turns for SFT only
where a template marks them or TRL has a training version of it (not Llama 3.1/3.2's). For any other model this
module reads the model's own conversation format by rendering its template with marker texts (the preamble, the
text around a user turn and an assistant turn, and so the end-of-turn token), or, with no template, uses a plain
``User:``/``Assistant:`` format ending turns with the model's EOS. It writes a template in that format whose tools
and calls take the ``<tool_call>`` JSON form of TRL's Qwen3 template, parsed by TRL's own Qwen3 response template
anchored on the model's assistant header and end-of-turn token. The end-of-turn token becomes the tokenizer's EOS:
generation stops there, as TRL's GRPO expects.

    from agentenv_nb.train.model.tool_template import use_tool_template
    use_tool_template(tokenizer)    # load_model does this; prints one line when it changes the template
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass

_SYSTEM, _USER, _REPLY, _USER_AGAIN = "SYSTEM_x7q", "USER_x7q", "REPLY_x7q", "AGAIN_x7q"
"""Marker texts rendered through the model's template to find what its template writes around them."""

PLAIN_USER, PLAIN_ASSISTANT, PLAIN_SYSTEM = "User: ", "Assistant:\n", "System: "
"""The turn headers of the format given to a model with no chat template. The assistant's ends with a newline, which
byte-level tokenizers never merge with the text after it (a space they do), so the prompt's last token is the one
training saw there."""


@dataclass(frozen=True)
class ConversationFormat:
    """What a model's template writes around each turn: ``(before, after)`` its content."""

    preamble: str
    user: tuple[str, str]
    assistant: tuple[str, str]  # after: the end-of-turn token, then whatever separates turns
    system: tuple[str, str] | None  # None: the system text opens the first user turn, as Gemma's and Mistral's do
    end_of_turn: str


def plain_format(tokenizer) -> ConversationFormat:
    """A plain ``User:``/``Assistant:`` format for a model with no chat template, ending turns with its EOS."""
    if tokenizer.eos_token is None:
        raise ValueError("agentenv_nb can't build a tool-calling template for this model: it has no chat template "
                         "and no EOS token to end turns with; set tokenizer.eos_token to the token its turns end with")
    return ConversationFormat(tokenizer.bos_token or "", (PLAIN_USER, "\n"), (PLAIN_ASSISTANT,
                              tokenizer.eos_token + "\n"), (PLAIN_SYSTEM, "\n"), tokenizer.eos_token)


def conversation_format(tokenizer) -> ConversationFormat:
    """``tokenizer``'s turn format, read from its chat template. Raises ValueError naming what its template does that
    a tool-calling template can't be built from."""
    def render(*turns, prompt=False):
        messages = [{"role": role, "content": text} for role, text in turns]
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        except Exception as e:  # jinja2's TemplateError from raise_exception, a TypeError, ...
            raise ValueError(f"the chat template fails on a {'/'.join(r for r, _ in turns)} conversation "
                             f"({type(e).__name__}: {e})") from None

    user, reply = ("user", _USER), ("assistant", _REPLY)
    one, prompted = render(user), render(user, prompt=True)
    answered, again = render(user, reply), render(user, reply, ("user", _USER_AGAIN))
    if _REPLY not in answered or again[len(answered):].count(_USER_AGAIN) != 1:
        raise ValueError("the chat template drops the text of a user/assistant conversation's turns")
    if not (prompted.startswith(one) and answered.startswith(one) and again.startswith(answered)):
        raise ValueError("the chat template renders earlier turns differently once later turns follow")
    header = answered[len(one):answered.index(_REPLY)]
    if prompted[len(one):] != header:
        raise ValueError(f"the chat template's generation prompt {prompted[len(one):]!r} is not the header "
                         f"{header!r} it writes before an assistant turn")
    user_before, user_after = again[len(answered):].split(_USER_AGAIN)
    assistant_after = answered[answered.index(_REPLY) + len(_REPLY):]
    opening = one[:one.index(_USER)]
    if not opening.endswith(user_before) or one[one.index(_USER) + len(_USER):] != user_after:
        raise ValueError("the chat template writes the first user turn differently from later ones")
    first = tokenizer.encode(assistant_after, add_special_tokens=False)[:1]
    end_of_turn = tokenizer.convert_ids_to_tokens(first[0]) if first else ""
    if end_of_turn not in tokenizer.all_special_tokens + list(tokenizer.get_added_vocab()) \
            or not assistant_after.startswith(end_of_turn):
        raise ValueError(f"the chat template ends an assistant turn with {assistant_after!r}, not a single token")
    preamble = opening[:len(opening) - len(user_before)]
    return ConversationFormat(preamble, (user_before, user_after), (header, assistant_after),
                              _system_turn(render, preamble, one), end_of_turn)


def _system_turn(render, preamble: str, one: str) -> tuple[str, str] | None:
    """What the template writes around a system turn of its own, or None where it has none (it refuses one, or
    folds the system text into the first user turn)."""
    try:
        both = render(("system", _SYSTEM), ("user", _USER))
    except ValueError:  # Mistral's and Gemma 1's templates refuse a system role
        return None
    rest = one[len(preamble):]
    if not (both.startswith(preamble) and both.endswith(rest)) or _SYSTEM not in both[:len(both) - len(rest)]:
        return None
    before, after = both[len(preamble):len(both) - len(rest)].split(_SYSTEM)
    return before, after


_TOOLS_TEXT = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
               "function signatures within <tools></tools> XML tags:\n<tools>")
_CALLS_TEXT = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")
"""The tools' system text of TRL's Qwen3 template, word for word: the call form the parser reads."""

_TEMPLATE = """{#- agentenv_nb's tool-calling template: this model's turns, TRL's Qwen3 tool-call form -#}
{%- set preamble, user_before, user_after = PREAMBLE, USER_BEFORE, USER_AFTER -%}
{%- set header, assistant_after, end_of_turn = HEADER, ASSISTANT_AFTER, END_OF_TURN -%}
{%- set system_turn, system_before, system_after = SYSTEM_TURN, SYSTEM_BEFORE, SYSTEM_AFTER -%}
{%- set ns = namespace(system='', start=0) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.system = messages[0].content -%}
    {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
    {%- set ns.system = (ns.system + '\\n\\n' if ns.system else '') + TOOLS_TEXT -%}
    {%- for tool in tools -%}{%- set ns.system = ns.system + '\\n' + (tool | tojson) -%}{%- endfor -%}
    {%- set ns.system = ns.system + CALLS_TEXT -%}
{%- endif -%}
{{- preamble -}}
{%- if ns.system and system_turn -%}
    {{- system_before + ns.system + system_after -}}
    {%- set ns.system = '' -%}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
    {%- set content = message.content if message.content is string else '' -%}
    {%- if message.role == 'assistant' -%}
        {{- header -}}
        {%- generation -%}
        {{- content -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set function = call.function if call.function else call -%}
            {{- '\\n' if content or not loop.first else '' -}}
            {{- '<tool_call>\\n{"name": "' + function.name + '", "arguments": ' -}}
            {{- function.arguments if function.arguments is string else function.arguments | tojson -}}
            {{- '}\\n</tool_call>' -}}
        {%- endfor -%}
        {{- end_of_turn -}}
        {%- endgeneration -%}
        {{- assistant_after[end_of_turn | length:] -}}
    {%- else -%}
        {%- set first = loop.first or messages[ns.start + loop.index0 - 1].role != message.role -%}
        {%- set last = loop.last or messages[ns.start + loop.index0 + 1].role != message.role -%}
        {%- if message.role == 'tool' -%}
            {%- set content = '<tool_response>\\n' + content + '\\n</tool_response>' -%}
            {%- set content = content if first else '\\n' + content -%}
        {%- else -%}
            {%- set first, last = true, true -%}
        {%- endif -%}
        {%- if first -%}
            {{- user_before -}}
            {%- if ns.system -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}
        {%- endif -%}
        {{- content -}}
        {%- if last -%}{{- user_after -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- header -}}{%- endif -%}"""


def tool_template(fmt: ConversationFormat) -> str:
    """A tool-calling chat template in ``fmt``'s turns: tools in the system text (or atop the first user turn), calls
    as ``<tool_call>`` JSON, tool results as a user turn of ``<tool_response>`` blocks, as TRL's Qwen3 template
    writes them; ``{% generation %}`` marks each assistant turn, its end-of-turn token included."""
    system_before, system_after = fmt.system or ("", "")
    values = {"PREAMBLE": fmt.preamble, "USER_BEFORE": fmt.user[0], "USER_AFTER": fmt.user[1],
              "HEADER": fmt.assistant[0], "ASSISTANT_AFTER": fmt.assistant[1], "END_OF_TURN": fmt.end_of_turn,
              "SYSTEM_TURN": fmt.system is not None, "SYSTEM_BEFORE": system_before, "SYSTEM_AFTER": system_after,
              "TOOLS_TEXT": _TOOLS_TEXT, "CALLS_TEXT": _CALLS_TEXT}
    return re.sub("|".join(values), lambda name: json.dumps(values[name.group()]), _TEMPLATE)


def response_template(fmt: ConversationFormat) -> dict:
    """TRL's Qwen3 response template (transformers' parser spec), anchored on ``fmt``'s assistant header (or, where
    it writes none, on the end of a user turn) and closing content at its end-of-turn token."""
    from trl.chat_template_utils import qwen3_template

    spec = copy.deepcopy(qwen3_template)
    spec["start_anchor"] = fmt.assistant[0] or fmt.user[1]
    spec["fields"]["content"]["close_pattern"] = re.escape(fmt.end_of_turn) + r"\s*"
    return spec


def use_tool_template(tokenizer) -> None:
    """Make TRL parse and SFT-mask tool calls with ``tokenizer``: leave a template it can (or one with its own
    ``response_template``) as it is; for a ChatML model use TRL's Qwen3 template, which writes its tokens; otherwise
    build one from the model's own turns (``tool_template``), or a plain format where it has no template or one that
    can't be read, make its end-of-turn token the EOS, and say so."""
    from trl.chat_template_utils import qwen3_chat_template

    from agentenv_nb.client.checks import template_problems

    if not template_problems(tokenizer, round_trip=False):
        return
    if all(token in tokenizer.get_vocab() for token in ("<|im_start|>", "<|im_end|>")):
        tokenizer.chat_template = qwen3_chat_template
        print("agentenv_nb: TRL parses no tool calls from this model's chat template; using TRL's Qwen3 template, "
              "which writes the same <|im_start|>/<|im_end|> tokens")
        return
    if not getattr(tokenizer, "chat_template", None):
        fmt, source = plain_format(tokenizer), "a plain User:/Assistant: format (it has no chat template)"
    else:
        try:
            fmt, source = conversation_format(tokenizer), "its own turns"
        except ValueError as error:
            fmt, source = plain_format(tokenizer), f"a plain User:/Assistant: format ({error})"
    tokenizer.chat_template, tokenizer.response_template = tool_template(fmt), response_template(fmt)
    tokenizer.eos_token = fmt.end_of_turn
    print(f"agentenv_nb: TRL can't parse or SFT-mask tool calls with this model's chat template; using one built "
          f"from {source}, ending turns with {fmt.end_of_turn}, with <tool_call> JSON calls TRL's Qwen3 parser reads")
