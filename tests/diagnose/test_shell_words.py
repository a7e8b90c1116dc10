"""Reading a launch script's words without running it: the same words bash passes, where bash can know them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from megapilot.diagnose.shell_words import script_words
from megapilot.errors import MegapilotError

# Scripts whose every variable is assigned in the script: bash itself must see the same words.
# `cmd` is a command name; under bash it is a function that prints its argv.
SAME_AS_BASH = {
    "continuation": "cmd --a 1 \\\n    --b 2\n",
    "quotes_and_escapes": "cmd 'a b' \"c d\" e\\ f \"x\\\"y\" 'it'\\''s'\n",
    "array_with_comments": "ARR=(\n  --x 1  # a comment ( with parens )\n  \"two words\"\n)\ncmd \"${ARR[@]}\"\n",
    "unquoted_split_quoted_whole": "V=\"a  b\"\ncmd $V \"$V\" x$V\n",
    "defaults_of_unset": "cmd ${UNSET_X:-8} \"${UNSET_Y:-a b}\" ${UNSET_Z-z}\n",
    "appends": "A=x\nA+=y\nARR=(1)\nARR+=(2 \"3 4\")\ncmd $A \"${ARR[@]}\"\n",
    "declarations": "export TP=4 PP=2\ndeclare -a L=(a b)\nlocal_v=1 cmd $TP$PP \"${L[@]}\"\n",
    "separators": "cmd a; cmd b && cmd c\n",
    "empty_quoted_word_is_kept": "E=\ncmd \"\" x \"$E\" $E y\n",
    "adjacent_parts": "P=/ckpt\ncmd --save=$P/x \"--y=${P}\" ${P}z\n",
    "hash_inside_a_word": "cmd a#b # a comment\n",
    "first_element_of_array": "ARR=(first second)\ncmd $ARR \"${ARR}\"\n",
    # Megatron-LM's examples/mamba/train.sh picks its model size this way
    "case_runs_the_branch_its_subject_matches": (
        "SCALE=8B\ncase \"${SCALE}\" in\n  \"800M\")\n    TP=1\n    ;;\n  8B|16B)\n    TP=4\n"
        "    case $TP in 4) IN=yes ;; *) IN=no ;; esac\n    ;;\n  (*) TP=99 ;;\nesac\ncmd --tp $TP $IN\n"),
    "case_falls_to_its_catch_all": "S=x\ncase $S in a) cmd a ;; b|c) cmd bc ;; *) cmd star ;; esac\ncmd after\n",
}


def _bash_words(text: str) -> list[str]:
    program = "cmd() { printf '%s\\0' cmd \"$@\"; }\n" + text
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, timeout=10).stdout
    return out.split("\0")[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to compare with")
@pytest.mark.parametrize("name", sorted(SAME_AS_BASH))
def test_words_are_the_words_bash_passes(name: str) -> None:
    text = SAME_AS_BASH[name]
    assert script_words(text).words == _bash_words(text)


def test_what_only_running_would_know_stays_literal() -> None:
    read = script_words("torchrun --node-rank $NODE_RANK --master-addr $(hostname -i) --x `date` \"${#ARR[@]}\"\n")
    assert read.words == ["torchrun", "--node-rank", "$NODE_RANK", "--master-addr", "$(hostname -i)",
                          "--x", "`date`", "${#ARR[@]}"]


def test_a_case_on_an_unknown_subject_reads_every_branch() -> None:
    """Without the subject's value no branch can be chosen: each is read, the last assignment winning."""
    read = script_words("case $MODEL in small) TP=1 ;; large) TP=8 ;; esac\npython train.py --tp $TP\n")
    assert read.words == ["python", "train.py", "--tp", "8"]


def test_assignments_are_variables_not_words() -> None:
    read = script_words("TP=8\nexport SEQ=4096\nARR=(a b)\npython train.py\n")
    assert read.words == ["python", "train.py"]
    assert read.scalar("TP") == "8" and read.scalar("SEQ") == "4096" and read.variables["ARR"] == ["a", "b"]
    assert read.scalar("NOT_SET") is None


def test_here_document_body_is_kept_and_not_read_as_commands() -> None:
    read = script_words("cat > exp.yaml <<'EOF'\nmodules:\n  tp: 2 # not a comment to strip\nEOF\necho done\n")
    assert read.heredocs == ["modules:\n  tp: 2 # not a comment to strip\n"]
    assert read.words == ["cat", ">", "exp.yaml", "echo", "done"]


def test_dash_here_document_ends_at_a_tab_indented_delimiter() -> None:
    read = script_words("cat <<-END\n\tbody\n\tEND\necho after\n")
    assert read.heredocs == ["\tbody\n"] and read.words[-2:] == ["echo", "after"]


def test_sbatch_lines_set_the_job_environment() -> None:
    read = script_words("#!/bin/bash\n#SBATCH --nodes=2-4\n#SBATCH -J pretrain\n#SBATCH --ntasks-per-node 8 # per GPU\n"
                        "srun $SLURM_NNODES $SLURM_JOB_NAME $SLURM_NTASKS_PER_NODE $SLURM_JOB_NUM_NODES\n")
    assert read.sbatch == {"--nodes": "2-4", "-J": "pretrain", "--ntasks-per-node": "8"}
    assert read.words == ["srun", "2", "pretrain", "8", "2-4"]  # SLURM_NNODES is the minimum of a range


def test_a_variable_assigned_in_the_script_overrides_sbatch() -> None:
    assert script_words("#SBATCH -N 2\nSLURM_NNODES=3\ncmd $SLURM_NNODES\n").words == ["cmd", "3"]


@pytest.mark.parametrize(("text", "line"), [
    ("echo ok\ncmd 'unterminated\n", 2),
    ('cmd "open\n', 1),  # the quote runs to the end of the text: the line where it opened is named
    ('echo a\ncmd --save "/ckpt\nnext line\n', 2),
    ("echo\necho\ncmd ${BROKEN\n", 3),
    ("cmd $(echo (\n", 1),
])
def test_unbalanced_quotes_braces_and_parentheses_are_user_errors_naming_the_line(text: str, line: int) -> None:
    with pytest.raises(MegapilotError) as info:
        script_words(text)
    assert info.value.field == "script" and f"line {line} " in str(info.value)


def test_empty_script_has_no_words() -> None:
    read = script_words("")
    assert read.words == [] and read.variables == {} and read.heredocs == [] and read.sbatch == {}
