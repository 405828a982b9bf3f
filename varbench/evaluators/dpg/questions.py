"""DPG-Bench's question file (``dpg_bench/dpg_bench.csv``), read as ELLA's ``prepare_dpg_data`` reads it.

Columns (ELLA's comment, in this order): ``item_id, text, keywords, proposition_id, dependency,
category_broad, category_detailed, tuple, question_natural_language``. Each row is one yes/no question
(``proposition_id``) about one prompt (``item_id``, the prompt file's stem); ``dependency`` lists the
proposition ids it depends on (``0``: none), comma-separated; ``tuple`` starts with the question's
category (``entity - whole (cat)`` -> ``entity - whole``; level 1 ``entity``).

ELLA's reading, reproduced on purpose (the published numbers come from it):

* the file is read with ``pandas.read_csv`` defaults, so ids keep the types pandas gives them (an id
  pandas reads as a number is not found for its image, whose name is text: that image fails);
* **the first data row is skipped** (``if i == 0: continue``): the first prompt loses its first
  question;
* rows of one item must be consecutive: a later run of rows for an item seen before replaces its
  questions (``question_dict[id] = dict(...)`` when the id differs from the previous row's).

The file is not part of varbench (nor can it be fetched here): the user's copy is read and its sha256
recorded. A row that ELLA's code would crash on (no such column, a proposition id or dependency that is
not an integer) raises :class:`~varbench.core.errors.MalformedFileError` naming the file and line (a file that is not
UTF-8: the byte).
"""
from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

from varbench.core import inputs
from varbench.core.errors import MalformedFileError

#: ELLA's columns, in the order its comment lists them
COLUMNS = ("item_id", "text", "keywords", "proposition_id", "dependency", "category_broad", "category_detailed",
           "tuple", "question_natural_language")
#: where the question file is published
PUBLISHED = ("https://github.com/TencentQQGYLab/ELLA/blob/3c228f1dc6c4d3cad0a47493816151a419f14db3/"
             "dpg_bench/dpg_bench.csv")


@dataclasses.dataclass
class ItemQuestions:
    """One prompt's questions, keyed by proposition id, in the file's order (ELLA's three dicts)."""

    qid2tuple: dict = dataclasses.field(default_factory=dict)
    qid2dependency: dict = dataclasses.field(default_factory=dict)
    qid2question: dict = dataclasses.field(default_factory=dict)


def category_of(tuple_text: Any) -> str:
    """ELLA's category of a question: its tuple's text before the first ``(``, stripped."""
    return str(tuple_text).split("(")[0].strip()


def read_dpg_questions(path: str | Path) -> dict[Any, ItemQuestions]:
    """``{item_id: ItemQuestions}`` as ELLA's ``prepare_dpg_data`` builds it (see the module docstring)."""
    import pandas as pd

    path = Path(path)
    # decoded by the one strict reader first (UTF-8, the file and byte named on failure), then parsed
    text = inputs.read_text(path, "DPG-Bench question file (dpg_bench.csv)")
    try:
        data = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise MalformedFileError(path, f"not a CSV file pandas can read ({e}); DPG-Bench's question file is "
                                 f"dpg_bench.csv with the columns {', '.join(COLUMNS)}") from None
    missing = [c for c in ("item_id", "proposition_id", "dependency", "tuple", "question_natural_language")
               if c not in data.columns]
    if missing:
        raise MalformedFileError(path, f"the header lacks the column(s) {missing} (has {list(data.columns)}); "
                                 f"DPG-Bench's question file has {', '.join(COLUMNS)}", line=1)
    questions: dict[Any, ItemQuestions] = {}
    previous_id: Any = ""
    for i, line in data.iterrows():
        if i == 0:                     # ELLA skips the first data row
            continue
        where = i + 2                  # the header is line 1, row i is line i + 2
        current_id = line.item_id
        try:
            qid = int(line.proposition_id)
        except (TypeError, ValueError):
            raise MalformedFileError(path, f"proposition_id {line.proposition_id!r} is not an integer", line=where) from None
        # a column of single ids reads as integers (ELLA's .split would fail there; we take them as written)
        try:
            deps = [int(d.strip()) for d in str(line.dependency).split(",")]
        except ValueError:
            raise MalformedFileError(path, f"dependency {line.dependency!r} is not a comma-separated list of "
                                     f"integer ids (0 = none)", line=where) from None
        if current_id == previous_id:
            item = questions[current_id]
        else:                          # a new run of rows (a repeated id's earlier questions are dropped)
            item = questions[current_id] = ItemQuestions()
        item.qid2tuple[qid] = line.tuple
        item.qid2dependency[qid] = deps
        item.qid2question[qid] = line.question_natural_language
        previous_id = current_id
    return questions
