"""Reading recipes from disk: the shipped ones (``fstrain/recipes/*.yaml``) and the user's own.

The validation is pure (:func:`fstrain.core.plan.recipe.parse_recipe`); this module only finds the
file, reads it (bounded) and parses YAML with :func:`fstrain.io.userfiles.load_yaml`, turning every failure into one
:class:`~fstrain.errors.InputError` that names the file (and the line, for YAML syntax).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fstrain.core.plan.hfconfig import is_hf_config, recipe_from_hf_config
from fstrain.core.plan.recipe import Recipe, parse_recipe, plan_name_from
from fstrain.errors import InputError
from fstrain.io.userfiles import load_json, load_yaml, read_text_bounded


def shipped_recipe_names() -> list[str]:
    """Names accepted by ``--model``, sorted."""
    folder = resources.files("fstrain") / "recipes"
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def load_shipped_recipe(name: str) -> Recipe:
    """The recipe ``fstrain/recipes/<name>.yaml`` (what ``--model NAME`` means): the name in any
    case, or a Hugging Face id of the same architecture (``meta-llama/Llama-3.1-8B``)."""
    chosen = resolve_model_name(name)
    text = (resources.files("fstrain") / "recipes" / f"{chosen}.yaml").read_text(encoding="utf-8")
    return _parse_text(text, f"recipes/{chosen}.yaml", chosen)


def resolve_model_name(name: str) -> str:
    """The shipped recipe ``--model NAME`` means, or one InputError listing the known names."""
    names = shipped_recipe_names()
    wanted = name.strip().lower()
    for candidate in names:
        if candidate.lower() == wanted:
            return candidate
    for candidate in names:  # Hugging Face ids, with or without the organisation
        text = (resources.files("fstrain") / "recipes" / f"{candidate}.yaml").read_text(encoding="utf-8")
        ids = [i.lower() for i in _parse_text(text, f"recipes/{candidate}.yaml", candidate).hf_ids]
        if wanted in ids or wanted in {i.rsplit("/", 1)[-1] for i in ids}:
            return candidate
    raise InputError(
        f"unknown model {name!r}",
        f"known models: {', '.join(names)} (or their Hugging Face ids, e.g. meta-llama/Llama-3.1-8B); "
        "or give your own file with --recipe PATH (a recipe YAML or a Hugging Face config.json)",
        "--model",
    )


def load_recipe_file(path: str) -> Recipe:
    """A user's recipe file (what ``--recipe PATH`` means): a recipe YAML, or a Hugging Face
    ``config.json`` (LlamaConfig, MistralConfig, MixtralConfig, GPT2Config)."""
    file = Path(path)
    if not file.is_file():
        raise InputError("recipe file not found", "check the path given to --recipe", path)
    text = read_text_bounded(file, "recipe", hint="check the path given to --recipe")
    stem = file.name[: -len(".yaml")] if file.name.endswith(".yaml") else file.stem
    if file.suffix == ".json" or text.lstrip().startswith("{"):
        data = load_json(text, path)
        if is_hf_config(data):
            # config.json says nothing of its model's name: its folder does (models/Llama-3.1-8B/config.json)
            name = plan_name_from(file.parent.name if file.name == "config.json" and file.parent.name else stem)
            return parse_recipe(recipe_from_hf_config(data, path, name or "model"), path, name)
        return parse_recipe(data, path, stem)
    return _parse_text(text, path, stem)


def _parse_text(text: str, where: str, default_name: str) -> Recipe:
    return parse_recipe(load_yaml(text, where), where, default_name)
