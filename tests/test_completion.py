"""`ambient-operator completion bash|zsh` (issue 34, item 2): real shells complete from it.

The script is printed by the installed console script and sourced by a
real `bash`; each case sets the words typed so far as bash does before it
calls a completion function (COMP_WORDS, COMP_CWORD) and reads COMPREPLY.
Expected candidates are literal. zsh runs the same cases (`make test`
installs it: `make test-tools`), with `compadd` and `_files` standing in for the completion
system's (they only print what they are given). The real kubectl completes
`kubectl ambient ...` through `kubectl_complete-ambient`, the same cases.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import run_kubectl

BINARY = Path(sys.executable).parent / "ambient-operator"
ROOT_COMMANDS = "completion crd import-values precheck render run status waypoint"
# (words typed, the last one being completed) -> the candidates, sorted.
CASES: list[tuple[list[str], str]] = [
    (["waypoint", "l"], "list"),
    ([""], ROOT_COMMANDS),
    (["waypoint", ""], "apply delete generate list status"),
    (["waypoint", "delete", "-n", "shop", "--a"], "--all"),
    # The value of -n is not a subcommand: `status` after it stays an argument.
    (["waypoint", "list", "-n", ""], ""),
    (["status", "-o", ""], "json text"),
    (["status", "--"], "--context --help --kubeconfig --mesh --output"),
    (["precheck", "--kubeconfig", "/nonexistent/dir/x"], ""),
    (["completion", ""], "bash zsh"),
    (["render", "--output", "j"], "json"),
    (["run", "--log-level", "w"], "warning"),
]


def script(shell: str, tmp_path: Path) -> Path:
    done = subprocess.run(
        [str(BINARY), "completion", shell], capture_output=True, text=True, check=True, timeout=60
    )
    path = tmp_path / f"completion.{shell}"
    path.write_text(done.stdout)
    return path


def _bash_driver(source: Path, cases: list[list[str]]) -> str:
    lines = [
        f"source {shlex.quote(str(source))}",
        "complete -p ambient-operator",
        'case_() { COMP_WORDS=(ambient-operator "$@"); COMP_CWORD=$#; COMPREPLY=(); '
        '_ambient_operator; printf "%s\\n" "${COMPREPLY[*]}"; }',
    ]
    lines += ["case_ " + " ".join(shlex.quote(w) for w in words) for words in cases]
    return "\n".join(lines) + "\n"


def _sorted(line: str) -> str:
    return " ".join(sorted(line.split()))


def test_bash_completes_subcommands_options_and_choices(tmp_path: Path) -> None:
    source = script("bash", tmp_path)
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", _bash_driver(source, [w for w, _ in CASES])],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    registered, *answers = done.stdout.split("\n")[:-1]
    assert registered == "complete -F _ambient_operator ambient-operator"
    assert [_sorted(a) for a in answers] == [expected for _, expected in CASES]


def test_bash_completes_file_names_for_kubeconfig(tmp_path: Path) -> None:
    source = script("bash", tmp_path)
    for name in ("kube.yaml", "kubelet.conf", "other"):
        (tmp_path / name).write_text("")
    driver = _bash_driver(source, [["status", "--kubeconfig", f"{tmp_path}/kube"]])
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", driver],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _sorted(done.stdout.split("\n")[1]) == f"{tmp_path}/kube.yaml {tmp_path}/kubelet.conf"


def _tables(text: str) -> dict[str, dict[str, str]]:
    """The four tables of a script, read back with a shell lexer (either syntax)."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("typeset -gA "):
            current = out.setdefault(line.split()[-1], {})
        elif line == ")":
            current = None
        elif current is not None and line.startswith("  ["):
            key, value = line.strip()[1:].split("]=", 1)
            current[shlex.split(key)[0]] = shlex.split(value)[0] if value else ""
        elif current is not None and line.startswith("  "):
            key, value = shlex.split(line)
            current[key] = value
    return out


def test_the_zsh_script_carries_the_same_tables_and_parses(tmp_path: Path) -> None:
    """Without zsh on the machine, as far as can be checked: the same data, balanced syntax."""
    bash_text, zsh_text = (script(shell, tmp_path).read_text() for shell in ("bash", "zsh"))
    bash_tables, zsh_tables = _tables(bash_text), _tables(zsh_text)
    assert sorted(zsh_tables) == [
        "_ambient_operator_options",
        "_ambient_operator_subcommands",
        "_ambient_operator_values",
        "_ambient_operator_words",
    ]
    assert zsh_tables == bash_tables
    assert zsh_tables["_ambient_operator_subcommands"]["ambient-operator waypoint"] == (
        "apply list delete status generate"
    )
    assert zsh_text.startswith("#compdef ambient-operator\n")
    # bash's parser accepts the zsh script's quoting, braces and control structures.
    for path in (tmp_path / "completion.bash", tmp_path / "completion.zsh"):
        done = subprocess.run(
            ["bash", "-n", str(path)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr


def test_zsh_completes_the_same(tmp_path: Path) -> None:
    # `make test` installs zsh first (make test-tools): missing, this test fails.
    assert shutil.which("zsh"), "zsh is not installed: `make test-tools` installs it with apt-get"
    source = script("zsh", tmp_path)
    lines = [
        # The completion system's functions, reduced to printing their candidates;
        # compadd keeps those the word typed so far ($PREFIX) begins, as the real one does.
        "compdef() { print -r -- registered $@ }",
        "compadd() { [[ $1 == -- ]] && shift; local w; local -a m; "
        'for w in "$@"; do [[ $w == "$PREFIX"* ]] && m+=("$w"); done; print -r -- "${m[*]}" }',
        "_files() { print -r -- FILES }",
        f"source {shlex.quote(str(source))}",
    ]
    for words, _ in CASES:
        quoted = " ".join(shlex.quote(w) for w in words)
        lines.append(
            f"words=(ambient-operator {quoted}); CURRENT={len(words) + 1}; "
            f"PREFIX={shlex.quote(words[-1])}; _ambient_operator || print"
        )
    done = subprocess.run(
        ["zsh", "-f", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    registered, *answers = done.stdout.split("\n")[:-1]
    assert registered == "registered _ambient_operator ambient-operator"
    expected = [e if words[-2:-1] != ["--kubeconfig"] else "FILES" for words, e in CASES]
    assert [_sorted(a) for a in answers] == expected


def test_kubectl_completes_the_plugin_through_kubectl_complete_ambient() -> None:
    """The real kubectl (1.26+) runs `kubectl_complete-ambient` for `kubectl ambient <TAB>`:
    its hidden `__complete` command prints what a shell would offer, then the directive."""
    for words, expected in CASES:
        done = run_kubectl(["__complete", "ambient", *words], BINARY.parent)
        assert done.returncode == 0, done.stderr
        *offered, directive = done.stdout.splitlines()
        files = words[-2:-1] == ["--kubeconfig"]
        # 0: the shell completes file names; 4 (NoFileComp): only what is listed.
        assert (_sorted(" ".join(offered)), directive) == (
            ("", ":0") if files else (expected, ":4")
        ), words
