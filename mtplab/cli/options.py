"""The command line's options from RunConfig's fields, the run's RunConfig from them (every problem at once, in
the options' words), and the parser and help formatters every command uses."""

from __future__ import annotations

import argparse

from mtplab.experiment import config
from mtplab.experiment.config import RunConfig
from mtplab.experiment.params import GROUPS


def lenient_number(text: str):
    """An option's number (numbers separated by commas: a tuple, one per batch row), or its text unchanged so that
    validation names it with the others."""
    if "," in text:
        return tuple(lenient_number(part.strip()) for part in text.split(","))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def option_flag(f) -> str:
    """A RunConfig field's option: its metadata's, else --name-with-dashes (--no-... for a boolean defaulting True)."""
    if f.metadata["flag"]:
        return f.metadata["flag"]
    name = f.name.replace("_", "-")
    return f"--no-{name}" if f.default is True else f"--{name}"


def add_run_options(p: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One option per RunConfig field (or those named in `only`), from its metadata, in option groups by field group.

    Numbers are parsed leniently (a bad one reaches validation, which names it with the others);
    a boolean is a switch turning its default around. An older option name (an alias) is an option of
    its own, so that giving both is refused rather than one silently winning.
    """
    groups = {name: p.add_argument_group(f"{name} options") for name in GROUPS} if only is None else {}
    for f in config.fields():
        if only is not None and f.name not in only:
            continue
        # argparse formats help texts with %: a literal one ("95% interval") must be written %%
        meta, where = f.metadata | {"help": f.metadata["help"].replace("%", "%%")}, groups.get(f.metadata["group"], p)
        if isinstance(f.default, bool):
            action = "store_false" if f.default else "store_true"
            text = (f"turn {f.name} off; {f.name}: {meta['help']} (default: not given, {f.name} on)" if f.default
                    else meta["help"] + " (default: off)")
            where.add_argument(option_flag(f), dest=f.name, action=action, default=None, help=text)
            continue
        kind = lenient_number if isinstance(f.default, (int, float)) else None
        text = option_help(meta["help"], config.choices(f))
        text += f" (default {f.default} when not given)" if meta["cli_unset"] else f" (default: {f.default})"
        where.add_argument(option_flag(f), dest=f.name, type=kind, help=text)
        for n, alias in enumerate(meta["aliases"]):
            where.add_argument(alias, dest=f"{f.name}__alias{n}", type=kind, metavar=f.name.upper(), help=f"older name of {option_flag(f)}")


def given_options(args) -> tuple[dict, list[str]]:
    """The RunConfig fields the command line gave (an alias's value under its field), and each field named twice."""
    given, twice = {}, []
    for f in config.fields():
        if getattr(args, f.name, None) is not None:
            given[f.name] = getattr(args, f.name)
        for n, alias in enumerate(f.metadata["aliases"]):
            other = getattr(args, f"{f.name}__alias{n}", None)
            if other is None:
                continue
            if f.name in given:
                twice.append(f"{alias} {other!r} and {option_flag(f)} {given[f.name]!r}: name the {f.name} once")
            else:
                given[f.name] = other
    return given, twice


def as_options(problem: str) -> str:
    """A RunConfig problem in the command line's words: each field named by its option (`k=0` -> `--k 0`)."""
    import re

    for f in sorted(config.fields(), key=lambda f: -len(f.name)):
        flag = "--" + f.name.replace("_", "-")
        problem = re.sub(rf"(?<![\w-]){f.name}=", f"{flag} ", problem)
        problem = re.sub(rf"^unknown {f.name} ", f"unknown --{f.name.replace('_', '-')} ", problem)
    return problem


def run_config(args) -> tuple[RunConfig | None, list[str]]:
    """The run's RunConfig, or every problem with the options at once."""
    given, problems = given_options(args)
    values = config.defaults() | config.with_implied_acceptance(given)
    try:
        run = RunConfig(**values)
    except config.ConfigError as err:
        run, problems = None, problems + [as_options(p) for p in err.problems]
    # A drafter parameter given at all (its default value too) belongs to its drafter, as in a grid.
    explicit = {n: v for n, v in given.items() if n in config.drafter_params()}
    problems += [t for p in config.drafter_param_problems(values["drafter"], explicit) if (t := as_options(p)) not in problems]
    by_name = {f.name: f for f in config.fields()}
    problems += [as_options(p) for p in config.engine_param_problems(
        values["engine"], given, lambda n, v: option_flag(by_name[n]) if isinstance(v, bool) else f"{option_flag(by_name[n])} {v}")]
    return (None if problems else run), problems


class Parser(argparse.ArgumentParser):
    """argparse's parser whose mistakes are one line from the command they belong to: an unrecognized option is
    refused by that command (with the option it most likely meant), not by `mtplab` with its whole usage."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not self._subparsers:  # a command's own parser (a group's leaves it to its command)
            from mtplab.base.names import likeliest

            options = [o for o in self._option_string_actions if o.startswith("--")]
            named = [extra + (f" (did you mean {close}?)" if extra.startswith("-") and (
                close := likeliest(extra.split("=")[0], options)) else "") for extra in extras]
            self.error(f"unrecognized argument{'s' if len(extras) > 1 else ''}: {', '.join(named)}")
        return namespace, extras

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists every option)\n")


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help: `off` for a flag; none added where the help says it already."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.default is None:
            return text + " (default: none)"
        if action.default is False or (isinstance(action, argparse._StoreFalseAction) and action.default is True):
            return text + " (default: off)"  # a switch: off unless given
        return super()._get_help_string(action)


class EpilogFormatter(Formatter, argparse.RawDescriptionHelpFormatter):
    """Formatter whose description and epilog keep their own lines."""


def option_help(text: str, choices=None) -> str:
    """An option's help with its choices; the formatter appends the default."""
    return text + (f" (choices: {', '.join(choices)})" if choices else "")
