"""The tables and lines a notebook shows, as a person reads them: whole text (pandas' own display cuts a cell past 50
characters with "…"), one header row, and no line that says what isn't so; and the map of the package README.md and
the package's docstring draw, true to its files; the presets' figures where notebook 03 and README quote them."""

import html
import json
import re
from pathlib import Path

import pandas as pd

from agentenv_nb.notebook import views
from agentenv_nb.notebook.transcript import transcript
from agentenv_nb.train import presets
from agentenv_nb.train.rollout import Rollout

from .conftest import one_turn_task, write_bundle

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "agentenv_nb"


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


def is_module(path: Path) -> bool:
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_table() -> dict[str, list[str]]:
    """README.md's table of the package: each row's folder, and the modules it names (a code span of lowercase
    names and slashes, as `serve/thread`; spans with capitals, dots or spaces are other things)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The package"):text.index("### Settings")]
    rows = {}
    for folder, owns in re.findall(r"^\| (`[a-z_]+/`|top level) \| (.+) \|$", section, re.M):
        rows[folder.strip("`")] = re.findall(r"`([a-z_]+(?:/[a-z_]+)*)`", owns)
    return rows


def test_every_module_the_readme_s_package_table_names_is_where_it_says():
    rows = package_table()
    assert set(rows) == {"tasks/", "envs/", "client/", "train/", "notebook/", "host/", "top level"}
    missing = [f"{folder} {name}" for folder, names in rows.items() for name in names
               if not is_module(PACKAGE / folder.replace("top level", "") / name)]
    assert not missing, f"README.md's package table names modules that aren't there: {missing}"


def test_the_readme_s_package_table_names_every_module_or_its_package():
    named = {Path(folder.replace("top level", "")) / name for folder, names in package_table().items()
             for name in names}
    modules = [path.relative_to(PACKAGE).with_suffix("") for path in sorted(PACKAGE.rglob("*.py"))
               if path.stem not in ("__init__", "__main__")]
    unnamed = [str(module) for module in modules if not named & {module, *module.parents[:-1]}]
    assert not unnamed, f"README.md's package table says nothing of: {unnamed}"


def test_the_package_docstring_names_subpackages_that_are_there():
    import agentenv_nb

    names = re.findall(r"``([a-z_]+)``", agentenv_nb.__doc__)
    assert {"tasks", "envs", "client", "train", "notebook", "host"} <= set(names)
    assert [name for name in names if not is_module(PACKAGE / name)] == []


def figures(text: str) -> set[float]:
    """The numbers ``text`` says, presets' names ("16gb") and model sizes ("1B") aside."""
    text = re.sub(r"[\"'][\w-]*[\"']|\b\d+B\b", "", text)
    return {float(number) for number in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", text)}


def test_notebooks_02_and_03_say_what_an_unset_trainer_setting_gives_as_the_presets_hold_it():
    """Each trainer setting's comment in notebook 03's parameters cell quotes the recipe's figure and only figures a
    preset holds for it (a small model's too), as notebook 02's SFT_STEPS quotes the recipe's passes and "cpu-tiny"'s
    steps: changing a preset without its comment fails here."""
    from agentenv_nb.train.grpo.run import GRPORun

    from .test_train_command import parameters_cell

    recipe, all_presets = presets.PRESETS["24gb"], presets.PRESETS.values()
    settings = {"MAX_STEPS": (lambda p: p.max_steps, None), "LORA_RANK": (lambda p: p.lora_r, None),
                "LEARNING_RATE": (lambda p: p.learning_rate, recipe.small_learning_rate),
                "TEMPERATURE": (lambda p: p.temperature, recipe.small_temperature),
                "NUM_GENERATIONS": (lambda p: p.num_generations, None),
                "ROLLOUTS_A_STEP": (lambda p: p.per_device_train_batch_size * p.gradient_accumulation_steps, None)}

    def comments(notebook: str = "03_grpo") -> dict[str, str]:
        return dict(re.findall(r"^([A-Z_]+) = .+?  # (.+)$", parameters_cell(notebook), re.M))

    for name, (value, small) in settings.items():
        said = figures(comments()[name].split("None:")[1])
        held = {value(preset) for preset in all_presets} | {small} - {None}
        assert value(recipe) in said and said <= held, (name, said, held)
        assert f"the preset's {'max_steps ' * (name == 'MAX_STEPS')}({value(recipe):g}" in GRPORun.help(name), name
    assert f"(r{recipe.lora_r}/alpha{recipe.lora_alpha})" in comments()["LORA_RANK"] + GRPORun.help("lora_rank")
    tiny_steps = presets.PRESETS["cpu-tiny"].sft_max_steps
    assert comments("02_sft_warm_start")["SFT_STEPS"].endswith(f'({recipe.sft_num_train_epochs} pass; "cpu-tiny" '
                                                               f'{tiny_steps})')


def test_notebook_03_and_the_readme_quote_the_recipe_as_the_presets_hold_it():
    """The recipe notebook 03 opens on, and README's small-model settings, are the presets' figures."""
    from .test_train_command import NOTEBOOKS

    recipe = presets.PRESETS["24gb"]
    opening = "".join(json.loads((NOTEBOOKS / "03_grpo.ipynb").read_text())["cells"][0]["source"])
    rollouts = recipe.per_device_train_batch_size * recipe.gradient_accumulation_steps
    for fragment in (f"LoRA r{recipe.lora_r}/α{recipe.lora_alpha}",
                     f"{rollouts} rollouts a step ({rollouts // recipe.num_generations} days × "
                     f"{recipe.num_generations}) at temperature {recipe.temperature:g}",
                     f"thinking {'on' if recipe.enable_thinking else 'off'}",
                     f"at most {['no', 'one', 'two', 'three'][recipe.max_tool_calling_iterations]} tool rounds",
                     f"{recipe.loss_type} with β {recipe.beta:g}"):
        assert fragment in opening, fragment
    readme = " ".join((ROOT / "README.md").read_text().split())
    [small] = re.findall(r"a model under a billion parameters gets the preset's small-model settings \((.+?)\)", readme)
    assert recipe.small_model_below == 1e9 and f"a {recipe.small_lr_scheduler_type} learning rate" in small
    a_pass = recipe.small_sft_per_device_train_batch_size * recipe.small_sft_gradient_accumulation_steps
    assert figures(small) == {recipe.small_sft_num_train_epochs, recipe.small_sft_learning_rate, a_pass,
                              recipe.small_learning_rate, recipe.small_temperature}
