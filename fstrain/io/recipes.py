"""Reading recipes from disk: the shipped ones (``fstrain/recipes/*.yaml``), the user's own, and the
``config.json`` of any model in the local Hugging Face cache.

The validation is pure (:func:`fstrain.core.plan.recipe.parse_recipe`); this module only finds the
file, reads it (bounded) and parses YAML with :func:`fstrain.io.userfiles.load_yaml`, turning every failure into one
:class:`~fstrain.errors.InputError` that names the file (and the line, for YAML syntax).

The Hugging Face cache is read as ``huggingface_hub`` lays it out, offline (nothing here touches
the network): ``$HF_HUB_CACHE`` (or the older ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``,
else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``; a model ``ORG/NAME``
lives in ``models--ORG--NAME``, its files in ``snapshots/<revision>/``, and ``refs/main`` names the
revision ``main`` was when it was downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
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


def load_model(name: str, env: Mapping[str, str] | None = None) -> Recipe:
    """What ``--model NAME`` means: a shipped recipe (by name or Hugging Face id), else the
    ``config.json`` of the Hugging Face model ``ORG/NAME`` in the local cache (``env``: the
    environment that says where the cache is, ``os.environ`` by default)."""
    names = shipped_recipe_names()
    chosen = _shipped_choice(name, names)
    if chosen is not None:
        return _load_shipped(chosen)
    if "/" not in name.strip():
        raise _unknown_model(name, names)
    config = hub_config_path(name.strip(), os.environ if env is None else env)
    if config.is_file():
        return load_recipe_file(str(config), plan_name_from(name.strip().rsplit("/", 1)[-1]))
    raise InputError(
        f"unknown model {name!r}: not a shipped recipe, and not in the Hugging Face cache",
        f"looked for {config}; download it there (huggingface-cli download {name.strip()} config.json), "
        "point HF_HOME or HF_HUB_CACHE at the cache that has it, or give its config.json with --recipe PATH",
        "--model",
    )


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache ``env`` points at (``huggingface_hub``'s own precedence)."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "huggingface" / "hub"


def hub_config_path(model_id: str, env: Mapping[str, str]) -> Path:
    """Where ``model_id``'s ``config.json`` is in the cache: the snapshot ``refs/main`` names,
    else the most recently written snapshot that has one (a model downloaded at a pinned
    revision has no ``refs/main``), else where the first would be."""
    folder = hub_cache_dir(env) / ("models--" + model_id.replace("/", "--"))
    ref = folder / "refs" / "main"
    if ref.is_file():
        revision = read_text_bounded(ref, "Hugging Face ref", hint="is the cache intact?").strip()
        return folder / "snapshots" / revision / "config.json"
    snapshots = folder / "snapshots"
    found = sorted(snapshots.glob("*/config.json"), key=lambda path: path.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else snapshots / "main" / "config.json"


def load_shipped_recipe(name: str) -> Recipe:
    """The recipe ``fstrain/recipes/<name>.yaml`` (what ``--model NAME`` means): the name in any
    case, or a Hugging Face id of the same architecture (``meta-llama/Llama-3.1-8B``)."""
    return _load_shipped(resolve_model_name(name))


def _load_shipped(chosen: str) -> Recipe:
    """The shipped recipe named ``chosen`` exactly (a name :func:`resolve_model_name` gave)."""
    text = (resources.files("fstrain") / "recipes" / f"{chosen}.yaml").read_text(encoding="utf-8")
    return _parse_text(text, f"recipes/{chosen}.yaml", chosen)


def resolve_model_name(name: str) -> str:
    """The shipped recipe ``--model NAME`` means, or one InputError listing the known names."""
    names = shipped_recipe_names()
    chosen = _shipped_choice(name, names)
    if chosen is not None:
        return chosen
    raise _unknown_model(name, names)


def _unknown_model(name: str, names: list[str]) -> InputError:
    """The error for ``--model NAME`` that names no shipped recipe, listing them."""
    return InputError(
        f"unknown model {name!r}",
        f"known models: {', '.join(names)} (or their Hugging Face ids, e.g. meta-llama/Llama-3.1-8B, or any ORG/NAME "
        "in the local Hugging Face cache); or give your own file with --recipe PATH (a recipe YAML or a Hugging Face "
        "config.json)",
        "--model",
    )


def _shipped_choice(name: str, names: list[str]) -> str | None:
    wanted = name.strip().lower()
    for candidate in names:
        if candidate.lower() == wanted:
            return candidate
    for candidate in names:  # Hugging Face ids, with or without the organisation
        text = (resources.files("fstrain") / "recipes" / f"{candidate}.yaml").read_text(encoding="utf-8")
        ids = [i.lower() for i in _parse_text(text, f"recipes/{candidate}.yaml", candidate).hf_ids]
        if wanted in ids or wanted in {i.rsplit("/", 1)[-1] for i in ids}:
            return candidate
    return None


def load_recipe_file(path: str, name: str = "") -> Recipe:
    """A user's recipe file (what ``--recipe PATH`` means): a recipe YAML, or a Hugging Face
    ``config.json`` (:data:`fstrain.core.plan.hfconfig.SUPPORTED`); ``name`` names a config.json's
    model (default: its folder's name)."""
    file = Path(path)
    if not file.is_file():
        raise InputError("recipe file not found", "check the path given to --recipe", path)
    text = read_text_bounded(file, "recipe", hint="check the path given to --recipe")
    stem = file.name[: -len(".yaml")] if file.name.endswith(".yaml") else file.stem
    if file.suffix == ".json" or text.lstrip().startswith("{"):
        data = load_json(text, path)
        if is_hf_config(data):
            # config.json says nothing of its model's name: its folder does (models/Llama-3.1-8B/config.json)
            name = name or plan_name_from(file.parent.name if file.name == "config.json" and file.parent.name else stem)
            recipe = parse_recipe(recipe_from_hf_config(data, path, name or "model"), path, name)
            return replace(recipe, hf_config=text)
        return parse_recipe(data, path, stem)
    return _parse_text(text, path, stem)


def _parse_text(text: str, where: str, default_name: str) -> Recipe:
    return parse_recipe(load_yaml(text, where), where, default_name)
