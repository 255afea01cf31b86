"""The verbs of `sluiceway cmd` on destinations, the broker, connections and durable
subscriptions: one admin API call each (two when a confirmation shows what would be lost or
whom it concerns), the answer printed as imqcmd prints it, or as the API's JSON with --json."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from sluiceway.cli.adminapi import AdminApi, Refused, UsageError
from sluiceway.cli.tables import Column, json_or_text, render, render_pairs


@dataclass(frozen=True, slots=True)
class Context:
    """What a verb works with: the API, the parsed command line, where to print."""

    api: AdminApi
    args: argparse.Namespace
    out: TextIO

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def print(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")

    def show(self, answer: Any, text: Callable[[], str]) -> None:
        """The API's `answer` as JSON with --json, else `text()`, made for people from it."""
        json_or_text(self.out, self.json, answer, text)

    @property
    def path(self) -> str:
        """The API path of the destination named by -t and -n."""
        return destination_path(self.args.type, self.args.name)

    @property
    def label(self) -> str:
        return f"{self.args.type} {self.args.name}"


def destination_path(kind: str, name: str) -> str:
    return f"/destinations/{kind}/{urllib.parse.quote(name, safe='')}"


def confirm(question: Callable[[], str], force: bool) -> bool:
    """imqcmd asks before destroying; -f says yes. Without a terminal there is no one to ask.
    `question` is called only when there is someone to ask (it may ask the broker what would
    be lost)."""
    if force:
        return True
    if not sys.stdin.isatty():
        raise UsageError("this asks for confirmation and there is no terminal to ask on: add -f")
    sys.stderr.write(f"{question()} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in {"y", "yes"}


def parse_properties(options: list[str]) -> dict[str, str]:
    """-o NAME=VALUE options as a dict (the last of a repeated name wins)."""
    properties = {}
    for option in options:
        name, equals, value = option.partition("=")
        if not equals or not name.strip():
            raise UsageError(f"-o {option!r}: expected NAME=VALUE, e.g. -o maxNumMsgs=5000")
        properties[name.strip()] = value.strip()
    return properties


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _changes(properties: dict[str, str], in_force: dict[str, str]) -> str:
    return ", ".join(f"{name}={in_force.get(name, value)}" for name, value in properties.items())


# -- destinations ------------------------------------------------------------------------------

LIST_DST = (
    Column("Name", "name", numeric=False),
    Column("Type", "type", numeric=False),
    Column("State", "state", numeric=False),
    Column("Producers", "producers"),
    Column("Consumers", "consumers"),
    Column("Count", "msgs", group="Msgs"),
    Column("UnAck", "unacked", group="Msgs"),
    Column("Avg Size", "avg_size", group="Msgs"),
    # Not an Open MQ column: the destination's pipeline readers (cursor or lease groups).
    Column("Readers", "pipeline_readers"),
)


def list_dst(ctx: Context) -> None:
    kind = ctx.args.type
    rows = ctx.api.get("/destinations", type=kind) if kind else ctx.api.get("/destinations")
    ctx.show(rows, lambda: render(LIST_DST, rows))


def query_dst(ctx: Context) -> None:
    detail = ctx.api.get(ctx.path)
    ctx.show(detail, lambda: _dst_text(detail))


def _dst_text(detail: dict[str, Any]) -> str:
    summary, totals = detail["summary"], detail["totals"]
    state = [
        ("Destination Name", summary["name"]),
        ("Destination Type", summary["type"]),
        ("Destination State", summary["state"]),
        ("Throttled", summary["throttled"]),
        ("Current Number of Messages", summary["msgs"]),
        ("  Waiting for a Consumer", summary["pending"]),
        ("  UnAcknowledged", summary["unacked"]),
        ("Current Message Bytes", summary["msg_bytes"]),
        ("Average Message Size", summary["avg_size"]),
        ("Current Number of Producers", summary["producers"]),
        ("  Held SENDs", summary["held_sends"]),
        ("Current Number of Active Consumers", summary["active_consumers"]),
        ("Current Number of Backup Consumers", summary["backup_consumers"]),
        ("  Paused by Flow Control", len(detail.get("paused_consumers") or [])),
        ("Current Number of Pipeline Readers", summary["pipeline_readers"]),
    ]
    state += [
        (
            f"  {reader['kind']} {reader['group']}",
            f"lag {reader['lag_messages']} messages, {reader['lag_seconds']} s",
        )
        for reader in detail.get("readers") or []
    ]
    if summary["type"] == "topic":
        state.append(("Durable Subscriptions", detail.get("durables", 0)))
    counters = [
        ("Msgs In", totals["msgs_in"]),
        ("Msgs Out", totals["msgs_out"]),
        ("Msg Bytes In", totals["bytes_in"]),
        ("Msg Bytes Out", totals["bytes_out"]),
        *((name.capitalize(), totals[name]) for name in _OUTCOMES),
        # Older brokers' totals have no deadline counters.
        *((label, totals[name]) for name, label in _DEADLINES if name in totals),
    ]
    return (
        render_pairs(state)
        + "\nSince created:\n"
        + render_pairs(counters, indent="  ")
        + "\nProperties (change with update dst -o NAME=VALUE):\n"
        + render_pairs(detail["properties"].items(), indent="  ")
    )


_OUTCOMES = ("consumed", "redelivered", "expired", "dead", "dropped", "discarded")
_DEADLINES = (("late", "Consumed Late"), ("deadline_misses", "Deadline Misses"))


def create_dst(ctx: Context) -> None:
    properties = parse_properties(ctx.args.properties)
    body = {"type": ctx.args.type, "name": ctx.args.name, "properties": properties}
    detail = ctx.api.post("/destinations", body)

    def text() -> str:
        extra = f" ({_changes(properties, detail['properties'])})" if properties else ""
        return f"Created {ctx.label}{extra}."

    ctx.show(detail, text)


def update_dst(ctx: Context) -> None:
    properties = parse_properties(ctx.args.properties)
    detail = ctx.api.patch(ctx.path, {"properties": properties})
    ctx.show(detail, lambda: f"Updated {ctx.label}: {_changes(properties, detail['properties'])}.")


def destroy_dst(ctx: Context) -> None:
    def question() -> str:
        held = ctx.api.get(ctx.path)["summary"]["msgs"]
        return f"Destroy {ctx.label} and the {plural(held, 'message')} it holds?"

    if not confirm(question, ctx.args.force):
        ctx.print(f"Not destroyed: {ctx.label}.")
        return
    answer = ctx.api.delete(ctx.path)
    ctx.show(answer, lambda: f"Destroyed {ctx.label}.")


def pause_dst(ctx: Context) -> None:
    _pause_or_resume(ctx, "pause", ctx.args.pause_target or "ALL")


def resume_dst(ctx: Context) -> None:
    _pause_or_resume(ctx, "resume", "ALL")


def _pause_or_resume(ctx: Context, verb: str, target: str) -> None:
    done = "Paused" if verb == "pause" else "Resumed"
    body = {"target": target}
    if ctx.args.name is None:
        answer = ctx.api.post(f"/destinations/{verb}", body)

        def text() -> str:
            count = len(answer.get("paused" if verb == "pause" else "resumed", []))
            what = f" ({target}); the dead message queue never pauses" if verb == "pause" else ""
            return f"{done} all {plural(count, 'destination')}{what}."

        ctx.show(answer, text)
        return
    detail = ctx.api.post(f"{ctx.path}/{verb}", body)
    ctx.show(detail, lambda: f"{done} {ctx.label}: its state is now {detail['summary']['state']}.")


def purge_dst(ctx: Context) -> None:
    def question() -> str:
        waiting = ctx.api.get(ctx.path)["summary"]["pending"]
        return f"Remove the {plural(waiting, 'message')} waiting in {ctx.label}?"

    if not confirm(question, ctx.args.force):
        ctx.print(f"Not purged: {ctx.label}.")
        return
    answer = ctx.api.post(f"{ctx.path}/purge")
    ctx.show(answer, lambda: f"Purged {ctx.label}: {plural(answer['purged'], 'message')} removed.")


def compact_dst(ctx: Context) -> None:
    if ctx.args.name is None:
        answer = ctx.api.post("/destinations/compact")
    else:
        answer = ctx.api.post(f"{ctx.path}/compact")
    ctx.show(
        answer,
        lambda: (
            "Compacted the journal (shared by all destinations): "
            f"{plural(answer['segments_deleted'], 'segment')} deleted, "
            f"{answer['segments_compacted']} rewritten."
        ),
    )


# -- the broker --------------------------------------------------------------------------------


def query_bkr(ctx: Context) -> None:
    broker = ctx.api.get("/broker")
    ctx.show(broker, lambda: _broker_text(broker))


def _broker_text(broker: dict[str, Any]) -> str:
    memory = broker["memory"]
    services = ", ".join(f"{name} {where}" for name, where in broker["services"].items())
    state = [
        ("Version", broker["version"]),
        ("Instance", broker["instance"]),
        ("Uptime (s)", broker["uptime"]),
        ("Services", services),
        ("Current Number of Connections", broker["connections"]),
        ("Number of Destinations", broker["destinations"]),
        ("Current Number of Messages in System", broker["msgs"]),
        ("Current Total Message Bytes in System", broker["msg_bytes"]),
        ("Current Number of Messages in Dead Message Queue", broker["dmq_msgs"]),
        ("Current Total Message Bytes in Dead Message Queue", broker["dmq_bytes"]),
        ("Held Producers", broker["held_producers"]),
        ("Throttled Destinations", broker["throttled"]),
        ("Memory Level", memory["level"]),
        ("Memory Used (bytes)", memory["used"]),
        ("Memory Peak (bytes)", memory["peak"]),
        ("Memory Budget (bytes)", memory["budget"]),
        ("Persistent Store", broker["store"]),
        ("Disk Used (bytes)", broker["disk_bytes"]),
        *_disk_rows(broker["disk"]),
    ]
    return (
        render_pairs(state)
        + "\nProperties (change with update bkr -o NAME=VALUE):\n"
        + render_pairs(broker["properties"].items(), indent="  ")
    )


def _disk_rows(disk: dict[str, Any]) -> list[tuple[str, object]]:
    """The journal's disk: its state, with the reason while it is not ok."""
    rows: list[tuple[str, object]] = [
        ("Disk State", disk["state"].upper()),
        ("Disk Free (bytes)", disk["free"]),
        ("Disk Free Limit (bytes)", disk["free_limit"]),
    ]
    if disk["state"] != "ok":
        rows.append(("Disk State Reason", disk["reason"]))
    if disk["backlog"]:
        rows.append(("Journal Bytes Waiting for the Disk", disk["backlog"]))
    return rows


def update_bkr(ctx: Context) -> None:
    properties = parse_properties(ctx.args.properties)
    broker = ctx.api.patch("/broker", {"properties": properties})
    ctx.show(broker, lambda: f"Updated the broker: {_changes(properties, broker['properties'])}.")


# -- connections and durable subscriptions -----------------------------------------------------

LIST_CXN = (
    Column("Connection ID", "id"),
    Column("User", "user", numeric=False),
    Column("Service", "service", numeric=False),
    Column("Producers", "producers"),
    Column("Consumers", "subscriptions"),
    Column("Host", "peer", numeric=False),
    Column("Client ID", "client_id", numeric=False),
)
LIST_DUR = (
    Column("Name", "name", numeric=False),
    Column("Client ID", "client_id", numeric=False),
    Column("Topic", "topic", numeric=False),
    Column("Number of Messages", "backlog"),
    Column("UnAck", "unacked"),
    Column("Durable Sub State", "state", numeric=False),
)

# imqcmd's `list bkr`: the members of the cluster the broker belongs to.
LIST_BKR = (
    Column("Broker ID", "broker_id", numeric=False),
    Column("Address", "address", numeric=False),
    Column("State", "state", numeric=False),
    Column("Msgs", "msgs"),
    Column("Takeover Broker ID", "taken_over_by", numeric=False),
    Column("Time since last status timestamp (seconds)", "heartbeat_age"),
)


def list_bkr(ctx: Context) -> None:
    view = ctx.api.get("/cluster")
    ctx.show(view, lambda: _bkr_text(view))


def _bkr_text(view: dict[str, Any]) -> str:
    if view["ha"]:
        cluster = view["cluster_id"] or "(no cluster id)"
        head = f"Brokers in cluster {cluster}, as broker {view['broker_id']} sees them:"
    else:
        head = "This broker is not a member of a cluster (imq.cluster.ha is false):"
    return f"{head}\n\n{render(LIST_BKR, view['members'])}"


def list_cxn(ctx: Context) -> None:
    rows = ctx.api.get("/connections")
    ctx.show(rows, lambda: render(LIST_CXN, rows) if rows else "No connections.")


def list_dur(ctx: Context) -> None:
    rows = ctx.api.get("/durables")
    ctx.show(rows, lambda: render(LIST_DUR, rows) if rows else "No durable subscriptions.")


def destroy_dur(ctx: Context) -> None:
    name, client_id = ctx.args.name, ctx.args.client_id
    label = f"durable subscription {name} of client {client_id}"
    if not confirm(lambda: f"Destroy {label} and the messages kept for it?", ctx.args.force):
        ctx.print(f"Not destroyed: {label}.")
        return
    quote = urllib.parse.quote
    answer = ctx.api.delete(f"/durables/{quote(client_id, safe='')}/{quote(name, safe='')}")
    ctx.show(answer, lambda: f"Destroyed {label}.")


def destroy_cxn(ctx: Context) -> None:
    """Close a connection: its client gets an ERROR with the reason (-reason), then is closed."""
    number = connection_id(ctx.args.name)
    label = f"connection {number}"

    def question() -> str:
        rows = ctx.api.get("/connections")
        row = next((row for row in rows if row["id"] == number), None)
        if row is None:
            raise Refused(
                f"no such connection: {label} is not open; `sluiceway cmd list cxn` lists the "
                "open connections",
                http_status=404,
            )
        who = f"user {row['user']}, " if row["user"] else ""
        return f"Destroy {label} ({who}{row['service']} from {row['peer']})?"

    if not confirm(question, ctx.args.force):
        ctx.print(f"Not destroyed: {label}.")
        return
    body = {"reason": ctx.args.reason} if ctx.args.reason else {}
    answer = ctx.api.delete(f"/connections/{number}", body)
    ctx.show(answer, lambda: f"Destroyed {label}{_of_user(answer)} ({answer['peer']}).")


def _of_user(answer: dict[str, Any]) -> str:
    return f" of user {answer['user']}" if answer["user"] else ""


def connection_id(text: str) -> int:
    """A connection ID as `list cxn` shows it (-n)."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise UsageError(
            f"-n {text!r}: a connection ID is a positive whole number, as `list cxn` shows it"
        )
    return int(text)
