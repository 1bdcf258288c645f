"""What of the demonstrations SFT can learn from with this model, counted before any trainer is built: TRL's SFTTrainer
renders each with the chat template, masks all but the assistant's tokens, cuts it at ``max_length`` tokens and drops
what is left with no assistant token, silently (an empty set then fails deep inside the trainer: "num_samples=0").

    counted = count(rows, tokenizer, max_length=1024)   # counted.kept: the rows SFT learns from; counted.line(1024)
    rows = sft_set(rows, tokenizer, "cpu-tiny", model)   # the same at the preset's length, said; Stop if too few

Each loss has its cause and its fix: a template that fails on the conversation, one that marks no assistant turn, a
demonstration whose first reply begins past ``max_length`` in this model's tokens (dropped), or whose last ends past
it (cut short: its later calls are never learnt).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from agentenv_nb.stops import Stop

TOO_FEW = 0.5  # below this share of the demonstrations kept, SFT stops before the trainer: it would learn little
FAILS, UNMASKED, TOO_LONG, CUT = "the chat template fails on it", "no assistant turn marked", "too long", "cut short"


@dataclass
class Counted:
    """The demonstrations kept, and of the others why each was lost: ``lost`` counts each cause (``FAILS``,
    ``UNMASKED``, ``TOO_LONG``), ``cut`` the kept ones cut short; ``longest``: the most tokens one took."""

    kept: list[dict] = field(default_factory=list)
    lost: Counter = field(default_factory=Counter)
    cut: int = 0
    longest: int = 0
    error: str = ""  # the template's first error

    def line(self, max_length: int | None) -> str:
        """What SFT keeps of them, with each loss's cause and fix, in one line."""
        given = len(self.kept) + sum(self.lost.values())
        causes = []
        if self.lost[FAILS]:
            causes.append(f"{self.lost[FAILS]} the chat template fails on ({self.error}): fix it or set one that "
                          "renders tool calls (docs/own-bundle.md, \"Your own model\")")
        if self.lost[UNMASKED]:
            causes.append(f"{self.lost[UNMASKED]} with no assistant turn the template marks ({{% generation %}}) for "
                          "the assistant-only loss: use a template that marks them")
        if self.lost[TOO_LONG] or self.cut:
            lost = f"{self.lost[TOO_LONG]} whose first reply begins" if self.lost[TOO_LONG] else ""
            cut = f"{self.cut} cut short, their last reply ending" if self.cut else ""
            causes.append(f"{' and '.join(part for part in (lost, cut) if part)} past sft_max_length={max_length} "
                          f"tokens (the longest takes {self.longest} of this model's tokens): a preset with "
                          f"sft_max_length and max_seq_length of at least {self.longest} (dataclasses.replace)")
        return f"SFT keeps {len(self.kept)} of the {given} demonstrations: " + "; ".join(causes)


def count(rows: list[dict], tokenizer, max_length: int | None) -> Counted:
    """Render each SFT row (``messages``, and ``tools`` as JSON text) as TRL's SFTTrainer does, with its assistant
    mask, and sort it: kept (cut short where its last reply ends past ``max_length``), or lost and why."""
    from agentenv_nb.client.checks import masking_template

    counted = Counted()
    try:
        template = masking_template(tokenizer)  # as the trainer masks them: TRL's training version of some templates
    except ValueError:
        counted.lost[UNMASKED] = len(rows)
        return counted
    for row in rows:
        try:
            rendered = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]) or None,
                                                     chat_template=template, tokenize=True, return_dict=True,
                                                     return_assistant_tokens_mask=True)
        except Exception as e:  # jinja2's TemplateError, a TypeError, ...: as the trainer would meet it
            counted.lost[FAILS] += 1
            counted.error = counted.error or f"{type(e).__name__}: {e}"
            continue
        mask = list(rendered["assistant_masks"])
        counted.longest = max(counted.longest, len(mask))
        if 1 not in mask:
            counted.lost[UNMASKED] += 1
        elif max_length is not None and mask.index(1) >= max_length:
            counted.lost[TOO_LONG] += 1
        else:
            if max_length is not None and len(mask) - mask[::-1].index(1) > max_length:
                counted.cut += 1
            counted.kept.append(row)
    return counted


def sft_set(rows: list[dict], tokenizer, preset, model=None) -> list[dict]:
    """The rows SFT learns from with ``tokenizer`` at ``preset``'s ``sft_max_length`` (for ``model``, as
    ``presets.sft_kwargs``); a line says what was lost and why where any was, and ``Stop`` with that line where fewer
    than ``TOO_FEW`` of them are left."""
    from agentenv_nb.train import presets

    max_length = presets.sft_kwargs(preset, model=model)["max_length"]
    counted = count(rows, tokenizer, max_length)
    if len(counted.kept) < max(1, TOO_FEW * len(rows)):
        raise Stop(counted.line(max_length))
    if len(counted.kept) < len(rows) or counted.cut:
        print(counted.line(max_length))
    return counted.kept
