"""The stage headers of SEND, COMMIT and ABORT (docs/pipelines-protocol.md, "Stages"), read
into typed values with errors that name the header, and the stage COMMIT and ABORT themselves.

- SEND: `stage:SINK/BATCH/TASK` and `stage-ttl` (ms; default imq.stage.ttl). Not together
  with `transaction`: a stage is a transaction of its own, shared by name.
- COMMIT: `transaction:stage`, `stage:SINK/BATCH`, `stage-tasks:T1,T2,...` (required; empty for
  none), `stage-counts:N1,N2,...` (optional: what each task staged, checked). ABORT: the same,
  `stage-tasks` optional (absent: every task of the batch).

SINK follows destination-name rules; BATCH is a decimal integer from 0 to 2^63-1; a task is 1 to
200 characters, any but a comma (the separator of `stage-tasks`) and control characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from sluiceway.core.features.stages import StageArea, StagedSend, StageOutcome
from sluiceway.core.values.staging import MAX_BATCH, StageName
from sluiceway.errors import BadRequest
from sluiceway.protocol.frames import Frame
from sluiceway.session import headers as h

STAGE_TRANSACTION: Final = "stage"  # the `transaction` of a stage COMMIT or ABORT
MAX_TASK_LENGTH: Final = 200
MAX_TTL_MS: Final = 2**63 - 1
_SINK: Final = re.compile(r"[A-Za-z0-9_$.:\-]{1,200}")
_BATCH: Final = re.compile(r"[0-9]{1,19}")
_NOT_TASK: Final = re.compile(r"[,\x00-\x1f\x7f]")
_NAME_RULES: Final = (
    "SINK is 1 to 200 letters, digits or . - _ $ : characters, BATCH a decimal integer from 0 "
    "to 2^63-1"
)


def staged_send(frame: Frame, default_ttl_ms: int) -> StagedSend | None:
    """The stage a SEND names, or None when it has no `stage` header."""
    text = frame.headers.get("stage")
    if text is None:
        return None
    if "transaction" in frame.headers:
        raise BadRequest(
            "stage and transaction together",
            "a SEND with a stage header cannot also carry a transaction header: the stage is "
            "its transaction (published by a COMMIT of the stage); send one or the other",
        )
    parts = text.split("/", 2)
    if len(parts) != 3:
        raise _invalid(frame, "stage", text, "SINK/BATCH/TASK")
    sink, batch = _sink_batch(frame, parts[0], parts[1], text, "SINK/BATCH/TASK")
    task = _task(frame, "stage", parts[2])
    ttl = h.integer(frame, "stage-ttl", default_ttl_ms, minimum=1, maximum=MAX_TTL_MS)
    return StagedSend(StageName(sink, batch, task), ttl)


def is_stage_frame(frame: Frame) -> bool:
    """A COMMIT or ABORT meant for a stage (it carries a `stage` header)."""
    return "stage" in frame.headers


def handle(stages: StageArea, frame: Frame) -> StageOutcome:
    """Do what a stage COMMIT or ABORT asks."""
    transaction = frame.headers.get("transaction")
    if transaction != STAGE_TRANSACTION:
        raise BadRequest(
            "invalid transaction header",
            f"a {frame.command} with a stage header must carry transaction:{STAGE_TRANSACTION}; "
            f"got {'no transaction header' if transaction is None else repr(transaction)}",
        )
    text = frame.headers["stage"]
    parts = text.split("/")
    if len(parts) != 2:
        raise _invalid(frame, "stage", text, "SINK/BATCH (the batch, without a task)")
    sink, batch = _sink_batch(frame, parts[0], parts[1], text, "SINK/BATCH")
    if frame.command == "COMMIT":
        tasks = _tasks(frame, h.required(frame, "stage-tasks"))
        return stages.commit(sink, batch, tasks, _counts(frame, len(tasks)))
    listed = frame.headers.get("stage-tasks")
    return stages.abort(sink, batch, None if listed is None else _tasks(frame, listed))


def receipt_headers(outcome: StageOutcome) -> Mapping[str, str]:
    return {"stage-state": outcome.state.value, "stage-count": str(outcome.count)}


def _sink_batch(frame: Frame, sink: str, batch: str, text: str, shape: str) -> tuple[str, int]:
    if _SINK.fullmatch(sink) is None or _BATCH.fullmatch(batch) is None:
        raise _invalid(frame, "stage", text, shape)
    number = int(batch)
    if number > MAX_BATCH:
        raise _invalid(frame, "stage", text, shape)
    return sink, number


def _task(frame: Frame, header: str, task: str) -> str:
    if not task or len(task) > MAX_TASK_LENGTH or _NOT_TASK.search(task):
        raise BadRequest(
            f"invalid {header} header",
            f"the {header} header of a {frame.command} frame names a task {task!r}: a task is "
            f"1 to {MAX_TASK_LENGTH} characters, without commas or control characters",
        )
    return task


def _tasks(frame: Frame, text: str) -> list[str]:
    if not text:
        return []  # a batch none of whose tasks staged anything, or succeeded
    tasks = [_task(frame, "stage-tasks", task) for task in text.split(",")]
    if len(set(tasks)) != len(tasks):
        repeated = sorted({task for task in tasks if tasks.count(task) > 1})
        raise BadRequest(
            "invalid stage-tasks header",
            f"the stage-tasks header of a {frame.command} frame lists {', '.join(repeated)} more "
            "than once; list each task once, in the order to publish",
        )
    return tasks


def _counts(frame: Frame, tasks: int) -> list[int] | None:
    """`stage-counts`: the messages each listed task staged, as its writer counted them."""
    text = frame.headers.get("stage-counts")
    if text is None:
        return None
    parts = text.split(",") if text else []
    if len(parts) != tasks or not all(part.isascii() and part.isdigit() for part in parts):
        raise BadRequest(
            "invalid stage-counts header",
            f"the stage-counts header of a COMMIT must give one count (digits) for each of the "
            f"{tasks} tasks of stage-tasks, in the same order; got {text!r}",
        )
    return [int(part) for part in parts]


def _invalid(frame: Frame, header: str, text: str, shape: str) -> BadRequest:
    return BadRequest(
        f"invalid {header} header",
        f"the {header} header of a {frame.command} frame must be {shape} ({_NAME_RULES}); "
        f"got {text!r}",
    )
