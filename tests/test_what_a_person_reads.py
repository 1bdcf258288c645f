"""The tables and lines a notebook shows, as a person reads them: whole text (pandas' own display cuts a cell past 50
characters with "…"), one header row, and no line that says what isn't so."""

import html
import re

import pandas as pd

from agentenv_nb.notebook import views
from agentenv_nb.notebook.transcript import transcript
from agentenv_nb.train import presets
from agentenv_nb.train.rollout import Rollout

from .conftest import one_turn_task, write_bundle


def header_rows(page: str) -> list[list[str]]:
    [head] = re.findall(r"<thead>(.*?)</thead>", page, re.S)
    return [re.sub(r"<[^>]+>|\s+", " ", row).split() for row in re.findall(r"<tr[^>]*>(.*?)</tr>", head, re.S)]


def test_the_preset_table_names_its_preset_in_its_one_header_row():
    shown = presets.table("cpu-tiny")
    assert header_rows(shown._repr_html_()) == [["cpu-tiny", "part", "preset"]]  # as a notebook shows it
    assert shown.loc["temperature", "preset"] == 0.8


def test_the_tools_table_shows_each_tool_s_whole_description_under_one_header_row(tmp_path):
    from agentenv_nb import AgentEnv

    bundle = write_bundle(tmp_path / "b", {"one": one_turn_task("hi")}, {"train": ["one"]})
    with AgentEnv.local(bundle, split="train", processes=0) as env:
        shown = views.tools(env)
    [description] = shown.data.loc[shown.data.tool == "end_turn", "description"]
    assert len(description) > 50 and description in html.unescape(shown.to_html())
    assert header_rows(shown.to_html()) == [["toolset", "tool", "arguments", "description"]]


def test_a_demonstration_s_transcript_says_it_was_given_not_that_an_episode_ended_unscored():
    given = Rollout(task_id="", messages=[{"role": "user", "content": "What is the capital of Peru?"}], tools=[],
                    reward=None, tool_calls=0, tool_failures=0)
    assert "a demonstration, as given: not played here, so not scored" in transcript(given).to_html()
    played = {**given, "task_id": "/runs/bundles/quiz/peru"}
    assert "quiz/peru: not scored (the episode ended without a score)" in transcript(played).to_html()


def test_without_a_task_adapter_notebook_01_says_so_in_a_line_not_a_quoted_string(tmp_path, capsys):
    bundle = write_bundle(tmp_path / "b", {"one": one_turn_task("hi")}, {"train": ["one"]})
    assert views.adapter_view(None, bundle) is None
    assert capsys.readouterr().out.startswith("No task adapter knows this bundle: the baseline is the eval reward")
    assert isinstance(views.splits(bundle), pd.DataFrame)
