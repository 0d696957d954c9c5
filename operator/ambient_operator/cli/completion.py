"""`ambient-operator completion bash|zsh`: a shell completion script made from the parser.

The script is generated from the argparse tree of every subcommand, so it
cannot fall behind a new flag: four tables keyed by the command path
(`ambient-operator waypoint list`) say its subcommands, the words its
positional arguments accept, its options, and for each option that takes a
value, the choices of that value (or a file name). A small function per
shell walks the words typed so far through those tables.

    source <(ambient-operator completion bash)
    ambient-operator completion zsh > "${fpath[1]}/_ambient-operator"

Bash needs version 4 or later (associative arrays).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHELLS = ("bash", "zsh")
# The value of an option without choices: a file name (a Path, or metavar FILE
# or DIR), else anything, for which nothing is offered.
FILE, ANY = "<file>", "<any>"
FILE_METAVARS = ("FILE", "DIR")


@dataclass
class Tables:
    """What each command path offers; keys are paths, or `path option` for values."""

    prog: str
    subcommands: dict[str, list[str]] = field(default_factory=dict)
    words: dict[str, list[str]] = field(default_factory=dict)
    options: dict[str, list[str]] = field(default_factory=dict)
    values: dict[str, list[str]] = field(default_factory=dict)


def tables(parser: argparse.ArgumentParser, prog: str) -> Tables:
    """Walk the parser and its subparsers into completion tables."""
    out = Tables(prog)
    _walk(parser, prog, out)
    return out


def _walk(parser: argparse.ArgumentParser, path: str, out: Tables) -> None:
    options: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            choices: dict[str, argparse.ArgumentParser] = action.choices
            out.subcommands[path] = list(choices)
            for name, child in choices.items():
                _walk(child, f"{path} {name}", out)
            continue
        if not action.option_strings:
            if action.choices is not None:
                out.words.setdefault(path, []).extend(str(c) for c in action.choices)
            continue
        options += action.option_strings
        if action.nargs != 0:
            if action.choices is not None:
                values = [str(c) for c in action.choices]
            elif action.type is Path or action.metavar in FILE_METAVARS:
                values = [FILE]
            else:
                values = [ANY]
            for option in action.option_strings:
                out.values[f"{path} {option}"] = values
    out.options[path] = options


# Cobra's directives, which kubectl reads from a plugin's completion program:
# let the shell complete file names, or offer nothing more than what is listed.
FILES_DIRECTIVE, NO_FILES_DIRECTIVE = 0, 4


def candidates(t: Tables, words: list[str]) -> tuple[list[str], int]:
    """What to offer after `words`, the last one being the word completed, and the
    directive, walking the tables as the shell functions below do (for kubectl)."""
    *typed, current = words or [""]
    cmd, taken = t.prog, False
    for word in typed:
        if taken:
            taken = False
        elif f"{cmd} {word}" in t.values:
            taken = True
        elif not word.startswith("-") and word in t.subcommands.get(cmd, []):
            cmd = f"{cmd} {word}"
    values = t.values.get(f"{cmd} {typed[-1]}") if typed and taken else None
    if values == [FILE]:
        return [], FILES_DIRECTIVE
    if values == [ANY]:
        return [], NO_FILES_DIRECTIVE
    if values is None:
        kinds = (t.options,) if current.startswith("-") else (t.subcommands, t.words)
        values = [w for table in kinds for w in table.get(cmd, [])]
    return [v for v in values if v.startswith(current)], NO_FILES_DIRECTIVE


def _function_name(prog: str) -> str:
    return "_" + re.sub(r"[^A-Za-z0-9_]", "_", prog)


def _assoc(shell: str, name: str, table: dict[str, list[str]]) -> list[str]:
    """A global associative array of space-joined words, one entry a line.

    Global even when the script is sourced inside a function (bash-completion's
    loader, zsh's autoload); bash's `[key]=value` form, zsh's key-value pairs.
    """
    lines = [f"typeset -gA {name}", f"{name}=("]
    for key, words in table.items():
        key_text, value = shlex.quote(key), shlex.quote(" ".join(words))
        lines.append(f"  [{key_text}]={value}" if shell == "bash" else f"  {key_text} {value}")
    lines.append(")")
    return lines


def _data(shell: str, t: Tables, fn: str) -> list[str]:
    return [
        *_assoc(shell, f"{fn}_subcommands", t.subcommands),
        *_assoc(shell, f"{fn}_words", t.words),
        *_assoc(shell, f"{fn}_options", t.options),
        *_assoc(shell, f"{fn}_values", t.values),
    ]


def bash_script(t: Tables) -> str:
    """A bash completion script: source it, or put it in bash-completion's directory."""
    fn = _function_name(t.prog)
    body = f"""
{fn}() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev="" cmd={shlex.quote(t.prog)} word i
  for (( i = 1; i < COMP_CWORD; i++ )); do
    word=${{COMP_WORDS[i]}}
    if [[ -n ${{{fn}_values["$cmd $word"]+set}} ]]; then
      (( i++ ))
    elif [[ $word != -* && " ${{{fn}_subcommands[$cmd]-}} " == *" $word "* ]]; then
      cmd+=" $word"
    fi
  done
  (( COMP_CWORD > 1 )) && prev=${{COMP_WORDS[COMP_CWORD-1]}}
  local values=${{{fn}_values["$cmd $prev"]-}}
  COMPREPLY=()
  if [[ $values == {shlex.quote(FILE)} ]]; then
    compopt -o filenames 2>/dev/null
    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
  elif [[ $values == {shlex.quote(ANY)} ]]; then
    return 0
  elif [[ -n $values ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$values" -- "$cur")
  elif [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "${{{fn}_options[$cmd]-}}" -- "$cur")
  else
    local offered="${{{fn}_subcommands[$cmd]-}} ${{{fn}_words[$cmd]-}}"
    mapfile -t COMPREPLY < <(compgen -W "$offered" -- "$cur")
  fi
}}
complete -F {fn} {shlex.quote(t.prog)}
"""
    header = f"# bash completion for {t.prog}, generated by `{t.prog} completion bash`"
    return "\n".join([header, *_data("bash", t, fn)]) + "\n" + body


def zsh_script(t: Tables) -> str:
    """A zsh completion script: save it as `_<prog>` on $fpath, or source it after compinit."""
    fn = _function_name(t.prog)
    body = f"""
{fn}() {{
  local cur=${{words[CURRENT]}} prev=${{words[CURRENT-1]}} cmd={shlex.quote(t.prog)} word
  integer i=2
  while (( i < CURRENT )); do
    word=${{words[i]}}
    if (( ${{+{fn}_values[$cmd $word]}} )); then
      (( i++ ))
    elif [[ $word != -* && " ${{{fn}_subcommands[$cmd]}} " == *" $word "* ]]; then
      cmd+=" $word"
    fi
    (( i++ ))
  done
  (( CURRENT > 2 )) || prev=""
  local values=${{{fn}_values[$cmd $prev]}}
  if [[ $values == {shlex.quote(FILE)} ]]; then
    _files
  elif [[ $values == {shlex.quote(ANY)} ]]; then
    return 1
  elif [[ -n $values ]]; then
    compadd -- ${{=values}}
  elif [[ $cur == -* ]]; then
    compadd -- ${{={fn}_options[$cmd]}}
  else
    compadd -- ${{={fn}_subcommands[$cmd]}} ${{={fn}_words[$cmd]}}
  fi
}}
# Autoloaded from $fpath (as _{t.prog}), the file is the function: complete now.
# Sourced, it registers the function.
if [[ ${{funcstack[1]-}} == {shlex.quote("_" + t.prog)} ]]; then
  {fn} "$@"
else
  compdef {fn} {shlex.quote(t.prog)}
fi
"""
    header = [
        f"#compdef {t.prog}",
        f"# zsh completion for {t.prog}, generated by `{t.prog} completion zsh`",
    ]
    return "\n".join([*header, *_data("zsh", t, fn)]) + "\n" + body


def _cmd(args: argparse.Namespace, root: argparse.ArgumentParser) -> int:
    t = tables(root, args.prog or root.prog)
    sys.stdout.write(bash_script(t) if args.shell == "bash" else zsh_script(t))
    return 0


def add_parser(sub: Any, root: argparse.ArgumentParser) -> None:
    """Register `completion` on the CLI's subparsers; `root` is the parser it describes."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "completion",
        help="print a bash or zsh completion script for this command",
        description="bash: `source <(ambient-operator completion bash)` (in ~/.bashrc, or the "
        "output saved in bash-completion's completions directory). zsh: save the output as "
        '"_ambient-operator" in a directory on $fpath before compinit runs.',
    )
    parser.add_argument("shell", choices=SHELLS)
    parser.add_argument(
        "--prog",
        default=None,
        help="the command name to complete (default: this command's own name)",
    )
    parser.set_defaults(func=lambda args: _cmd(args, root))
