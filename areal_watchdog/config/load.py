"""Load an AReaL-style OmegaConf YAML file, apply Hydra-style overrides, then validate.

The resolved tree keeps every AReaL key for the training script; ``validate`` checks AReaL's
names and cluster and our ``launch`` and ``watchdog`` sections (docs/configuration.md).
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from areal_watchdog.common.errors import ConfigError, UserError
from areal_watchdog.config.model import JobConfig
from areal_watchdog.config.validate import validate


def load_config(
    path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()
) -> JobConfig:
    """Read, override, resolve and validate a config file; raise ConfigError on any problem."""
    source = str(path)
    tree = _read_yaml(source)
    for item in overrides:
        _apply_override(tree, item, source)
    try:
        raw = OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        reason = (exc.msg or type(exc).__name__).strip().splitlines()[0]
        raise ConfigError(source, str(key), f"cannot resolve the value: {reason}") from None
    if not isinstance(raw, dict):
        raise ConfigError(source, "<root>", "the file must hold a mapping of keys")
    return validate(source, raw)


MAX_CONFIG_BYTES = 8 * 2**20  # AReaL's largest example configs are a few KB
MAX_CONFIG_VALUES = 100_000  # values once every alias is expanded


def _read_yaml(source: str) -> Any:
    if not os.path.isfile(source):
        raise UserError(f"{source}: no such config file.")
    if os.path.getsize(source) > MAX_CONFIG_BYTES:
        raise ConfigError(source, "<file>", f"is over {MAX_CONFIG_BYTES >> 20} MB: not a config")
    try:
        with open(source, encoding="utf-8") as fh:
            data = _safe_load_bounded(fh.read(), source)
    except UnicodeDecodeError:
        raise ConfigError(source, "<file>", "is not UTF-8 text (a binary file?)") from None
    except RecursionError:
        raise ConfigError(source, "<yaml>", "is nested too deeply to be a config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, "<yaml>", f"YAML syntax error at {where}: {problem}.") from None
    if not isinstance(data, dict):
        raise ConfigError(source, "<root>", "the file must hold a mapping of keys")
    _check_plain(source, data)
    try:
        return OmegaConf.create(data)
    except (OmegaConfBaseException, ValueError, TypeError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(source, "<yaml>", f"is not a valid config tree: {message}") from None


def _safe_load_bounded(text: str, source: str) -> Any:
    """``yaml.safe_load``, refusing a document whose aliases expand it past
    ``MAX_CONFIG_VALUES`` values (a "billion laughs" of a few lines would hold the launcher and
    its memory forever) before anything is built from it."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_values(node) > MAX_CONFIG_VALUES:
            raise ConfigError(
                source,
                "<yaml>",
                f"expands to over {MAX_CONFIG_VALUES:,} values through its aliases (*name): a "
                "YAML alias bomb? write the values out instead",
            )
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def _expanded_values(root: yaml.Node) -> int:
    """How many values the document holds once every alias is expanded, counted without
    expanding (each node once); a node that contains itself counts as too many."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = MAX_CONFIG_VALUES + 1  # until known: a cycle is too big
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in node.value)
        else:
            total = 1
        sizes[id(node)] = total = min(total, MAX_CONFIG_VALUES + 1)
        return total

    return size(root)


_PLAIN = (str, int, float, bool, list, dict, type(None))


def _check_plain(source: str, data: dict[str, Any]) -> None:
    """Name the first key that is null or holds a value YAML typed beyond plain data (a date,
    ``!!binary``, ``!!set``): OmegaConf would refuse it without saying where."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}".lstrip(".")
            if key is None:
                raise ConfigError(source, path or "<root>", "holds a key that is null: name it")
            if not isinstance(value, _PLAIN):
                raise ConfigError(
                    source,
                    where,
                    f"is a {type(value).__name__} ({value}): quote it if you mean text",
                )
            if isinstance(value, (dict, list)):
                stack.append((where, value))


def _apply_override(tree: Any, item: str, source: str) -> None:
    """Apply one Hydra-style override: ``a.b=v``, ``+a.b=v`` (add), ``++a.b=v``, ``~a.b``."""
    where = f"override '{item}'"
    if item.startswith("~"):
        key = item[1:].split("=", 1)[0]
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(tree, parent) if parent else tree
        if node is None or leaf not in node:
            raise ConfigError(where, key, f"cannot delete: the key is not in {source}")
        del node[leaf]
        return
    if "=" not in item:
        raise ConfigError(where, item, "overrides take the form key=value, +key=value or ~key")
    key, _, text = item.partition("=")
    mode = "set"
    if key.startswith("++"):
        key, mode = key[2:], "force"
    elif key.startswith("+"):
        key, mode = key[1:], "add"
    if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", key):
        raise ConfigError(where, key, "is not a dotted key name")
    exists = OmegaConf.select(tree, key, default="\0missing") != "\0missing"
    if mode == "set" and not exists:
        raise ConfigError(
            where, key, f"is not in {source}; use +{key}={text} to add a new key (Hydra grammar)"
        )
    if mode == "add" and exists:
        raise ConfigError(where, key, f"is already in {source}; use {key}={text} to change it")
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        value = text
    if not isinstance(value, (str, int, float, bool, list, dict, type(None))):
        value = text  # a date or a timestamp: keep the text, validation says what is expected
    try:
        OmegaConf.update(tree, key, value, merge=True, force_add=True)
    except OmegaConfBaseException:  # a list over a mapping: replace, validation will explain
        try:
            OmegaConf.update(tree, key, value, merge=False, force_add=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(where, key, f"cannot be set to {text!r}: {exc.msg}") from None
